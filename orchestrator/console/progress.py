"""How far a start got, while nodes connect, are probed and start their part.

On a terminal: one line, rewritten in place (`[orchestrator] probing: 812/1024 nodes, 2
failed`) and cleared when the step ends. Elsewhere (a pipe, a log file): nothing for a step
that ends within `QUIET_S`, then a line after 5 s, 15 s, 35 s, ... (each gap twice the last,
a minute at most), so a quick start prints no progress at all, a slow one says how far it
got, and a start of many minutes (1 000 nodes on a busy login node) does not flood a log
with it. Counts may come from any thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import BinaryIO

QUIET_S = 5.0  # not on a terminal: the time before the first line, then the first gap
LONGEST_GAP_S = 60.0  # ... which doubles with every line up to this
REDRAW_S = 0.1  # on a terminal: the least time between two redraws
CLEAR = b"\r\x1b[K"


class Progress:
    """One step's count of nodes done; `None` output: says nothing."""

    def __init__(
        self,
        out: BinaryIO | None,
        tty: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out, self.tty, self.clock = out, tty, clock
        self.lock = threading.Lock()
        self.what, self.total, self.done, self.failed = "", 0, 0, 0
        self.began = self.shown = 0.0
        self.gap = QUIET_S
        self.drawn, self.last = False, ""

    @classmethod
    def to(cls, out: BinaryIO | None) -> Progress:
        isatty = getattr(out, "isatty", None)
        return cls(out, bool(isatty and isatty()))

    def begin(self, what: str, total: int) -> None:
        with self.lock:
            self.what, self.total, self.done, self.failed = what, total, 0, 0
            self.began = self.shown = self.clock()
            self.last, self.gap = "", QUIET_S

    def count(self, done: int, failed: int = 0) -> None:
        """Where the step stands: `done` nodes finished it, `failed` of them without success."""
        with self.lock:
            self.done, self.failed = done, failed
            now = self.clock()
            line = self.line()
            if (
                self.tty
                and line != self.last
                and (now - self.shown >= REDRAW_S or done == self.total)
            ):
                self._write(CLEAR + line.encode())
                self.drawn, self.shown, self.last = True, now, line
            elif not self.tty and now - self.shown >= self.gap and done < self.total:
                self._write(line.encode() + b"\n")
                self.shown = now
                self.gap = min(2 * self.gap, LONGEST_GAP_S)

    def tick(self, ok: bool = True) -> None:
        """One more node finished the step."""
        self.count(self.done + 1, self.failed + (not ok))

    def end(self) -> None:
        """The step is over: a terminal's line is cleared (what follows says the rest)."""
        with self.lock:
            if self.drawn:
                self._write(CLEAR)
                self.drawn = False

    def line(self) -> str:
        failed = f", {self.failed} failed" if self.failed else ""
        return f"[orchestrator] {self.what}: {self.done}/{self.total} nodes{failed}"

    def _write(self, data: bytes) -> None:
        if self.out is None:
            return
        try:
            self.out.write(data)
            self.out.flush()
        except (OSError, ValueError):  # the terminal went away: the start goes on
            self.out = None
