"""How often a run's changes are told (status.json written): at once while telling is cheap,
else so that it takes at most SHARE of the controller's time.

Telling builds and writes the whole status: every node and rank. At 1 024 ranks that is
~15 ms, at 8 000 over 100 ms, and a stop of that many ranks changes the status on every pass
of the loop for seconds; written each time, it took most of the controller's CPU, and a
loss it should have named waited behind it. Changes that come while a telling is not due
yet are told together when it is; the last is always told (`tell(force=True)` at the end
of a run, and in the drain of a SLURM job's attempt).
"""

from __future__ import annotations

import time
from collections.abc import Callable

SHARE = 0.1  # of the time, at most, spent telling while changes keep coming
PACED_FROM_S = 0.005  # a telling cheaper than this is never held back (~1 ms at 16 nodes)


class StatusPace:
    def __init__(self, tell: Callable[[], None], clock: Callable[[], float] = time.monotonic):
        self._tell = tell
        self.clock = clock
        self.unsaid = False  # a change not told yet
        self.due = float("-inf")  # when the next telling may come

    def changed(self) -> None:
        self.unsaid = True

    def wait(self) -> float:
        """Seconds until a change waiting may be told; inf when none waits."""
        return max(0.0, self.due - self.clock()) if self.unsaid else float("inf")

    def tell(self, force: bool = False) -> None:
        """Tell what changed, if anything did and a telling is due (or `force`)."""
        if not self.unsaid:
            return
        began = self.clock()
        if began < self.due and not force:
            return
        self.unsaid = False
        self._tell()
        ended = self.clock()
        cost = ended - began
        self.due = ended + cost * (1 / SHARE - 1) if cost >= PACED_FROM_S else ended
