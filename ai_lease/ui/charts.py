"""Small server-rendered SVG bar charts: one bar per minute (the jobs page's last hour).

Only numbers and this module's own words reach the SVG; the caption is escaped anyway.
Styling is by class (``ui.css``), with fills that read standalone.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

__all__ = ["bar_chart"]

WIDTH, HEIGHT, TOP, BOTTOM = 240, 56, 4, 14


def bar_chart(chart_id: str, caption: str, values: Sequence[int], fill: str) -> Markup:
    """``values`` (oldest first) as ``<svg id=chart_id class="chart">``: a bar per value
    scaled to the largest, each with a ``<title>`` saying its count and minute, the
    largest value and the time span written under it."""
    peak = max(values, default=0)
    slot = WIDTH / max(len(values), 1)
    plot = HEIGHT - TOP - BOTTOM
    parts = [
        f'<svg id="{escape(chart_id)}" class="chart" xmlns="http://www.w3.org/2000/svg"'
        f' role="img" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}"'
        f' aria-label="{escape(caption)}" data-total="{sum(values)}" data-peak="{peak}"'
        f' font-family="sans-serif" font-size="10"><title>{escape(caption)}</title>',
        f'<line x1="0" y1="{HEIGHT - BOTTOM}" x2="{WIDTH}" y2="{HEIGHT - BOTTOM}" stroke="#bbb"/>',
    ]
    for index, value in enumerate(values):
        if value <= 0:
            continue
        tall = max(1.0, plot * value / peak)
        back = len(values) - 1 - index
        parts.append(
            f'<rect class="bar" x="{index * slot + 0.5:.1f}" y="{HEIGHT - BOTTOM - tall:.1f}"'
            f' width="{max(slot - 1, 1):.1f}" height="{tall:.1f}" fill="{fill}"'
            f' data-value="{value}"><title>{value} · {_minute(back)}</title></rect>'
        )
    parts.append(
        f'<text x="0" y="{HEIGHT - 2}" fill="#555">-{len(values)} min</text>'
        f'<text x="{WIDTH}" y="{HEIGHT - 2}" fill="#555" text-anchor="end">now</text>'
        f'<text x="{WIDTH / 2:.0f}" y="{HEIGHT - 2}" fill="#555" text-anchor="middle">'
        f"peak {peak}</text></svg>"
    )
    return Markup("".join(parts))


def _minute(back: int) -> str:
    return "this minute" if back == 0 else f"{back} min ago"
