"""Sizes in bytes as people write them: 64M, 1G, 512KiB (binary units), and back."""

from __future__ import annotations

import re

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'64M', '1G', '512KiB', '4096' -> bytes (binary units). ValueError if unreadable."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a size; write e.g. 64M, 1G, 512K or 4096")
    number, unit = match.groups()
    value = int(float(number) * _UNITS[unit.upper()])
    if value <= 0:
        raise ValueError(f"{text!r}: a size must be positive")
    return value


def format_size(size: int) -> str:
    """Bytes in the largest binary unit that divides them: 1024 -> '1K', 3000 -> '3000'."""
    for unit in ("T", "G", "M", "K"):
        if size >= _UNITS[unit] and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)


def human_bytes(size: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if size < 1024 or unit == "T":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}T"
