"""One file of the run record, appended to by the log stream, that never raises.

The controller's own disk may fill while a job runs: the job and its console go on, the
files lose what they cannot take, and what a rank's file lost is recorded so that it can be
completed from the node's copy later (orchestrator.nodes.refill).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

RETRY_S = 3.0  # a file that could not be written is tried again at most this often
BUFFER = 1 << 16  # bytes kept per file between flushes


def open_append(path: Path) -> BinaryIO:
    """The run record's files: appended to, unbuffered (LogFile buffers and counts)."""
    return open(path, "ab", buffering=0)  # noqa: SIM115


class LogFile:
    """One file of the run record, appended to; a failed write never raises out of it.

    A write that fails (no space, over quota, an I/O error) loses its bytes, and the file
    is cut back to its last whole line. A rank's file (`whole`) is never appended to after
    that: a file with a hole in the middle is worse than a short one, and the node keeps
    the rest (orchestrator.nodes.refill completes it). The other files are tried again every
    RETRY_S, and go on after a line that says how much is missing there.
    """

    def __init__(self, path: Path, whole: bool, opener: Callable[[Path], BinaryIO]) -> None:
        self.path = path
        self.whole = whole
        self.opener = opener
        self.handle: BinaryIO | None = None
        self.start: int | None = None  # its size when this sink first opened it
        self.size = 0  # its size as far as this sink knows it (whole lines)
        self.pending = bytearray()
        self.missed = 0  # bytes lost since the last write that went through
        self.lost = False  # a rank's file that missed bytes: left as it is
        self.retry_at = 0.0

    def write(self, data: bytes) -> OSError | None:
        """Append `data` (whole lines); the error that lost bytes, if one did now."""
        if self.lost:
            return None
        if self.missed and time.monotonic() < self.retry_at:
            self.missed += len(data)
            return None
        self.pending += data
        return self.flush() if len(self.pending) >= BUFFER else None

    def waiting(self) -> bool:
        """Whether bytes, or the line about bytes lost, wait to be written."""
        return not self.lost and bool(self.pending or self.missed)

    def flush(self) -> OSError | None:
        """Write what waits (unless the last failure was under RETRY_S ago); the error
        that lost bytes, if one did now."""
        if not self.waiting():
            return None
        if self.missed and time.monotonic() < self.retry_at:
            return None
        payload, self.pending = bytes(self.pending), bytearray()
        lead = gap_line(self.missed) if self.missed else b""
        data = lead + payload
        done = 0
        try:
            if self.handle is None:
                self.handle = self.opener(self.path)
                self.size = self.handle.seek(0, os.SEEK_END)
                if self.start is None:
                    self.start = self.size
            view = memoryview(data)
            while done < len(data):
                done += self.handle.write(view[done:]) or 0
        except OSError as exc:
            self._lose(data, done, len(lead))
            return exc
        self.size += done
        self.missed = 0
        return None

    def _lose(self, data: bytes, done: int, lead: int) -> None:
        """After a failed write of `data` of which `done` bytes went in: cut the file back
        to its last whole line and count what is missing."""
        keep = data.rfind(b"\n", 0, done) + 1
        if keep < lead:  # not even the line about the earlier gap went in
            keep = 0
        if self.start is None:  # it could not even be opened
            try:
                self.start = self.size = self.path.stat().st_size
            except OSError:
                self.start = self.size = 0
        if self.handle is not None and keep < done:
            try:
                self.handle.truncate(self.size + keep)
            except OSError:
                keep = done  # the partial line stays; the size says where the file ends
        self.size += keep
        self.missed += len(data) - max(keep, lead)
        self.retry_at = time.monotonic() + RETRY_S
        if self.whole:
            self.lost = True
            self.pending.clear()

    def close(self) -> OSError | None:
        """Write what waits (one more try, whenever the last failed) and close."""
        self.retry_at = 0.0
        error = self.flush()
        if self.handle is not None:
            try:
                self.handle.close()
            except OSError as exc:  # a file system that reports failed writes only now (NFS)
                error = error or exc
                if self.whole:
                    self.lost = True
                    with contextlib.suppress(OSError):
                        self.size = self.path.stat().st_size
            self.handle = None
        return error


def gap_line(missed: int) -> bytes:
    """What a file that goes on after a loss says where the loss is."""
    return (
        f"[orchestrator] {missed} bytes of output are missing here: the run record could not "
        "be written\n"
    ).encode()
