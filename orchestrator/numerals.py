"""Whole numbers as people type them (a hostfile's slots= and port=, a range bound, a slot
id, a flag, an environment variable): read once, here, so that text of any length is a
value or one `NumberError` saying the range, never a traceback. Python's int() refuses
text of more than 4300 digits (ValueError "Exceeds the limit"), so the digits are counted
before they are converted; the caller names where the text was (file:line, the flag).
"""

from __future__ import annotations

import math
import re

_WHOLE = re.compile(r"[+-]?[0-9]+")  # ASCII only: int() takes some other Unicode digits
SHOWN_CHARS = 32  # of a long value, the message shows this many characters and its length

PORT = (1, 65535)  # a TCP port: hostfile port=, --master-port, an ssh config's Port
MAX_SLOTS = 65536  # ranks on one host: a hostfile's slots=/max_slots=, a slot id below it
MAX_DIGITS = 18  # a number without a bound of its own (a host range's, a job id) < 10**18


class NumberError(ValueError):
    """Text that is not a whole number in the range asked for; `str()` says which."""


def whole_number(text: object, what: str, low: int = 0, high: int | None = None) -> int:
    """`text` as an int from `low` to `high` (None: below 10**MAX_DIGITS), or a
    `NumberError`: "`what` must be a number from 1 to 65535, got 70000"."""
    top = 10**MAX_DIGITS - 1 if high is None else high
    if isinstance(text, int) and not isinstance(text, bool):  # from Python, not typed
        if low <= text <= top:
            return text
        raise NumberError(f"{what} must be a number from {low} to {top}, got {shown(text)}")
    raw = text if isinstance(text, str) else str(text)
    stripped = raw.strip()
    if _WHOLE.fullmatch(stripped) and (low < 0 or stripped[0] not in "+-"):  # sign: if it may
        sign = "-" if stripped[0] == "-" else ""
        digits = stripped.lstrip("+-").lstrip("0") or "0"  # zero padding is not size
        # More digits than the bound has is out of range whatever they are: never int()
        # them (it raises past 4300 digits).
        if len(digits) <= len(str(max(abs(low), abs(top)))):
            number = int(sign + digits)
            if low <= number <= top:
                return number
    raise NumberError(f"{what} must be a number from {low} to {top}, got {_given(raw)}")


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`value` for a message, as repr() shows it, a long one cut: '1111…' (5000
    characters), the first `limit` characters of it quoted; an int too long for repr()
    (over 4300 digits) by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * limit:
        digits = int(abs(value).bit_length() * math.log10(2)) + 1
        return f"{'-' if value < 0 else ''}a number of about {digits} digits"
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return repr(value)
    return f"{text[:limit]!r}… ({len(text)} characters)"


def _given(text: str) -> str:
    """A short number as typed (`got -3`), anything else quoted and cut (`shown`)."""
    short = len(text) <= SHOWN_CHARS and _WHOLE.fullmatch(text.strip())
    return text.strip() if short else shown(text)
