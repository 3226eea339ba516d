"""Warnings of the SSH layer: each distinct line printed once per command, on stderr."""

from __future__ import annotations

import sys
import threading

_seen: set[str] = set()
_lock = threading.Lock()


def warn_once(text: str) -> None:
    """Print `warning: TEXT` unless this command already printed it."""
    with _lock:
        if text in _seen:
            return
        _seen.add(text)
    print(f"warning: {text}", file=sys.stderr, flush=True)
