"""Characters that change what a terminal shows instead of being shown, in one place.

Text from outside — a model's answer, a provider's error body, a job key, an owner id — may
hold control characters (ESC starts CSI and OSC sequences that move the cursor, retitle the
window, write hyperlinks; C1 controls do the same in one byte), Unicode format characters
(U+202E reverses the text after it, U+200B hides inside a word, U+FEFF is invisible) and
line or paragraph separators (U+2028, U+0085). :func:`inert` writes each as a visible escape
(``\\x1b``, ``\\u202e``) so a terminal shows what was sent; :data:`UNSAFE` is the class,
used also to refuse such characters in job keys.

>>> inert("ok\\x1b]0;pwned\\x07 \\u202eabc\\n\\tend")
'ok\\\\x1b]0;pwned\\\\x07 \\\\u202eabc\\n\\tend'
"""

from __future__ import annotations

import re

__all__ = ["UNSAFE", "inert"]

# C0 but tab and newline, DEL and C1; every Unicode format character (Cf), the line and
# paragraph separators (Zl, Zp: U+2028, U+2029) and lone surrogates (Unicode 14's Cf list).
UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2"
    "\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff"
    "\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def inert(text: str) -> str:
    """``text`` with every :data:`UNSAFE` character written as a visible escape."""
    return UNSAFE.sub(_escaped, text)
