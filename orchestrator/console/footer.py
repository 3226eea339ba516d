"""The footer of `launch` on a terminal: one line under the stream, saying how the run goes.

    [orchestrator] running, 16 rank(s) on 4 node(s) (16 running), step 1204, 2,421 samples/s

It is the summary `orchestrator top` puts over its table
(orchestrator.console.rank_table.summary), drawn after the stream's last line and rewritten
in place at most once a second. Every write to the console first clears it, so log lines
never mix with it, and the next flush draws it again under them. It is cut to the terminal's
width (read at each draw, since the window may change size), never wraps, and is cleared for
good when the run ends, before the closing lines. Not on a terminal (a pipe, a file,
`--detach`), or with `--no-footer`, there is none.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import BinaryIO

from orchestrator.console.progress import CLEAR

REDRAW_S = 1.0  # the text is made again at most this often
PREFIX = "[orchestrator] "


class Footer:
    """One line kept under everything else written to `console`."""

    def __init__(
        self, console: BinaryIO, clock: Callable[[], float] = time.monotonic, width: int = 0
    ) -> None:
        self.console = console
        self.clock = clock
        self.fixed_width = width  # 0: the terminal's
        self.text = ""
        self.drawn = False
        self.made = float("-inf")
        self.ended = False

    @classmethod
    def on(cls, console: BinaryIO | None) -> Footer | None:
        """A footer when `console` is a terminal, else None."""
        isatty = getattr(console, "isatty", None)
        if console is None or not (isatty and isatty()):
            return None
        return cls(console)

    def update(self, make_text: Callable[[], str]) -> None:
        """Make the text again when it is due (at most once a REDRAW_S) and show it."""
        now = self.clock()
        if self.ended or now - self.made < REDRAW_S:
            return
        self.made = now
        text = self._fit(PREFIX + make_text())
        if text != self.text or not self.drawn:
            self.text = text
            self._put(CLEAR + text.encode())
            self.drawn = True

    def before_write(self) -> None:
        """Something else is about to be written: take the footer away first."""
        if self.drawn:
            self._put(CLEAR)
            self.drawn = False

    def after_write(self) -> None:
        """Written and about to be flushed: the footer again under it."""
        if not self.drawn and self.text and not self.ended:
            self._put(CLEAR + self.text.encode())
            self.drawn = True

    def end(self) -> None:
        """The run is over: the footer goes and stays away."""
        self.before_write()
        self.ended = True

    def _fit(self, text: str) -> str:
        width = self.fixed_width or self._terminal_width()
        return text if len(text) < width else text[: max(0, width - 4)] + "..."

    def _terminal_width(self) -> int:
        try:
            columns = os.get_terminal_size(self.console.fileno()).columns
        except (OSError, ValueError, AttributeError):
            columns = 0
        return columns or 80  # a terminal that does not say its size: 0

    def _put(self, data: bytes) -> None:
        try:
            self.console.write(data)
        except (OSError, ValueError):  # the terminal went away: the run goes on
            self.ended = True
