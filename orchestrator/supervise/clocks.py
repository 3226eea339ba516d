"""Node times in the controller's clock: each node's offset, measured, never assumed.

Nodes' wall clocks differ (tens of milliseconds on a good day, seconds on a bad one), and a
stop reaches every node within milliseconds of the first failure, so two nodes' times can
only be compared once both are put into one clock. Each heartbeat is an NTP exchange: the
controller sends `hb T1` (its clock), the agent notes when it read it (T2, the node's clock)
and echoes both in its next `H T3 T1 T2`, which the controller receives at T4. Then

    offset = ((T2 - T1) + (T3 - T4)) / 2      (node clock minus controller clock)
    delay  = (T4 - T1) - (T3 - T2)            (the round trip, less the node's own wait)

and the true offset lies within delay / 2 of the estimate. The exchange with the smallest
delay among the recent ones is the best estimate (NTP's clock filter). Before any exchange,
the node's start gives an interval: its `S` time was taken after the controller sent the
step and before the controller received it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

SAMPLES = 16  # exchanges kept: a few minutes' worth at one per 10 s, so drift hardly shows


@dataclass(frozen=True)
class Sample:
    offset: float  # node clock minus controller clock, seconds
    error: float  # the true offset is within this of `offset`


@dataclass
class NodeClock:
    """What the controller knows of one node's clock."""

    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=SAMPLES))

    def exchange(self, t1: float, t2: float, t3: float, t4: float) -> None:
        """One heartbeat round trip: controller send, node receive, node send, controller
        receive (t1 and t4 in the controller's clock, t2 and t3 in the node's)."""
        delay = (t4 - t1) - (t3 - t2)
        if delay < 0:  # the node's clock was stepped mid-exchange: nothing to learn
            return
        self.samples.append(Sample(((t2 - t1) + (t3 - t4)) / 2, delay / 2))

    def bracket(self, sent: float, node_time: float, received: float) -> None:
        """A node time taken between the controller's `sent` and `received`."""
        if received < sent:
            return
        self.samples.append(Sample(node_time - (sent + received) / 2, (received - sent) / 2))

    def best(self) -> Sample | None:
        return min(self.samples, key=lambda s: s.error, default=None)

    def to_controller(self, node_time: float) -> float:
        """`node_time` in the controller's clock (unchanged while nothing is known)."""
        best = self.best()
        return node_time if best is None else node_time - best.offset

    def describe(self) -> str | None:
        best = self.best()
        if best is None:
            return None
        return f"{best.offset * 1000:+.1f} ms (+/- {best.error * 1000:.1f} ms)"
