"""``[limits]`` in the settings, which limits a call matches, and the metrics its events feed
(issue 29)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ai_lease.errors import ConfigError, InputError
from ai_lease.lease.call_limits import CallLimit, CallLimits
from ai_lease.lease.events import Event
from ai_lease.observe.metrics import Metrics
from ai_lease.settings import load_settings

TOML = """
[limits]
max_wait = 30

[limits."openai:gpt-4o-mini"]
concurrency = 4

[limits."http://127.0.0.1:8080/v1/"]
concurrency = 1
max_wait = 300
"""


def _load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> object:
    path = tmp_path / "ai-lease.toml"
    path.write_text(text, encoding="utf-8")
    return load_settings(path, env=env or {})


def test_each_table_is_a_limit_with_the_sections_wait_by_default(tmp_path: Path) -> None:
    settings = _load(tmp_path, TOML)
    limits = settings.run_config().limits  # type: ignore[attr-defined]
    assert limits == CallLimits(
        (
            CallLimit("http://127.0.0.1:8080/v1", 1, 300.0),
            CallLimit("openai:gpt-4o-mini", 4, 30.0),
        )
    )


def test_the_default_wait_comes_from_the_environment_too(tmp_path: Path) -> None:
    settings = _load(tmp_path, TOML, {"AI_LEASE_LIMITS__MAX_WAIT": "5"})
    (url, model) = settings.run_config().limits.limits  # type: ignore[attr-defined]
    assert (url.max_wait, model.max_wait) == (300.0, 5.0)


def test_no_limits_by_default_cost_nothing() -> None:
    limits = load_settings(env={}).run_config().limits
    assert not limits and limits.matching("openai", "gpt-4o-mini", "https://x") == ()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            '[limits."openai:m"]\nconcurrency = 0\n',
            "openai:m.concurrency: must be at least 1",
        ),
        ('[limits."openai:m"]\nconcurrency = 10001\n', "limits.openai:m.concurrency"),
        (
            '[limits."openai:m"]\n',
            "limits.openai:m: a limit needs concurrency, rpm, tpm or several",
        ),
        ('[limits."openai:m"]\nrpm = 0\n', "openai:m.rpm: must be at least 1"),
        ('[limits."openai:m"]\nrpm = 10001\n', "limits.openai:m.rpm"),
        ('[limits."openai:m"]\ntpm = 0\n', "openai:m.tpm: must be at least 1"),
        ('[limits."openai:m"]\ntpm = 1000000001\n', "limits.openai:m.tpm"),
        (
            '[limits."openai:m"]\nconcurrency = 2\ncolour = 3\n',
            "limits.openai:m.colour: unknown key",
        ),
        ('[limits."a b"]\nconcurrency = 1\n', "limit name 'a b' is invalid"),
        ('[limits."x"]\nconcurrency = 1\nmax_wait = -1\n', "limits.x.max_wait"),
        ("[limits]\nmax_wait = 1e9\n", "limits.max_wait"),
        (
            '[limits."http://h/v1"]\nconcurrency = 1\n[limits."http://h/v1/"]\nconcurrency = 2\n',
            "given twice",
        ),
    ],
)
def test_a_bad_limit_is_a_config_error_naming_it(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, text)
    assert said in str(caught.value)


def test_a_call_holds_every_matching_limit_in_name_order() -> None:
    limits = CallLimits(
        (
            CallLimit("openai-compatible:qwen", 2),
            CallLimit("http://10.0.0.5:8080/v1", 1),
            CallLimit("openai-compatible", 8),
            CallLimit("anthropic", 3),
        )
    )
    names = [
        x.name for x in limits.matching("openai-compatible", "qwen", "http://10.0.0.5:8080/v1/")
    ]
    assert names == ["http://10.0.0.5:8080/v1", "openai-compatible", "openai-compatible:qwen"]
    assert [x.name for x in limits.matching("openai-compatible", "llama", None)] == [
        "openai-compatible"
    ]
    assert limits.matching("gemini", "flash", "https://generativelanguage.googleapis.com") == ()


@pytest.mark.parametrize(
    ("name", "concurrency", "wait"),
    [("", 1, 1.0), ("ok", 0, 1.0), ("ok", True, 1.0), ("ok", 1, float("nan")), ("ok", 1, -1.0)],
)
def test_a_bad_call_limit_is_refused(name: str, concurrency: int, wait: float) -> None:
    with pytest.raises(InputError):
        CallLimit(name, concurrency, wait)


def test_the_slot_events_feed_the_three_metrics() -> None:
    metrics = Metrics(pipeline="p")
    limit = {"limit": "openai:gpt-4o-mini"}
    metrics(Event("slot_taken", "j1", value=2.5, attrs=limit))
    metrics(Event("slot_taken", "j2", value=0.0, attrs=limit))
    metrics(Event("slot_released", "j1", attrs=limit))
    metrics(Event("rate_limited", "j2", attrs=limit))
    labels = {"pipeline": "p", **limit}
    sample = metrics.registry.get_sample_value
    assert sample("provider_slots_in_use", labels) == 1.0
    assert sample("provider_slot_wait_seconds_count", labels) == 2.0
    assert sample("provider_slot_wait_seconds_sum", labels) == 2.5
    assert sample("provider_rate_limited_total", labels) == 1.0


def test_rpm_is_a_limit_alone_or_beside_concurrency(tmp_path: Path) -> None:
    """``rpm`` alone, or with ``concurrency``; the window has its own store name."""
    text = '[limits."openai:a"]\nrpm = 60\n[limits."openai:b"]\nconcurrency = 2\nrpm = 500\n'
    a, b = _load(tmp_path, text).run_config().limits.limits  # type: ignore[attr-defined]
    assert (a.concurrency, a.rpm, a.rate_name) == (None, 60, "openai:a~rpm")
    assert (b.concurrency, b.rpm) == (2, 500)
    assert CallLimit("x", 1).rate_name is None
    with pytest.raises(InputError, match="give concurrency, rpm, tpm or several"):
        CallLimit("x")
    with pytest.raises(InputError, match="rpm 0 is not in"):
        CallLimit("x", rpm=0)


def test_a_place_in_an_rpm_window_is_not_a_slot_in_use() -> None:
    """A place in the rpm window is taken, never released: it feeds the wait histogram, not
    the slots-in-use gauge (which would only ever grow)."""
    metrics = Metrics(pipeline="p")
    limit = {"limit": "openai:gpt-4o-mini"}
    metrics(Event("slot_taken", "j1", value=1.5, attrs={**limit, "window": "rpm"}))
    labels = {"pipeline": "p", **limit}
    sample = metrics.registry.get_sample_value
    assert not sample("provider_slots_in_use", labels)
    assert sample("provider_slot_wait_seconds_sum", labels) == 1.5
