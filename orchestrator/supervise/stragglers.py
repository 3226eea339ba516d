"""Stragglers: the rank that holds every other back, named while the run goes on.

In synchronous data-parallel training every rank's step lasts as long as the slowest one's,
so step time names nobody. What differs is each rank's own work: its step minus the time
it waited in collectives for the others (the bundled trainer reports it as `work_s`, see
orchestrator.trainer.reporting). A rank whose work, averaged over the last window
(--stragglers RATIO,SECONDS), stays above RATIO times the median of the other ranks' is named once:

    straggler: rank 37 on ceon19, its step work 2.1x the median for 30 s

For any program, with or without such metrics: a running rank that had been speaking (at
least SPOKEN times) and has been silent (no output line, no metrics line) for more than
SILENT_RATIO times the median silence of the other running ranks, and at least
SILENT_MIN_S, is named the same way. When the others are as silent (the whole job waits)
or the rank never spoke much (only rank 0 prints), nobody is named.

`slow` is what a swap reads (straggler_swap.py): the ranks slow now on both signals, their
own work above RATIO times the other ranks' median and the step (`step_s`, every rank's
alike in synchronous training) above RATIO times that median too: the run waits for them.
A rank that only reports work_s, or is silent, is never slow on both.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

from orchestrator.options.supervision import STRAGGLER_RATIO, STRAGGLER_WINDOW_S

MIN_COVER = 0.5  # a rank's window must span at least this share of its window to count
SILENT_RATIO = 4.0
SILENT_MIN_S = 30.0
SPOKEN = 3


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    why: str  # "work" or "silent"
    ratio: float  # its work or silence over the others' median
    span_s: float  # over how long
    named_at: float  # the controller's clock

    def line(self) -> str:
        if self.why == "silent":
            return (
                f"straggler: rank {self.rank} on {self.host}, silent for {self.span_s:.0f} s, "
                f"{self.ratio:.1f}x the other ranks' median"
            )
        return (
            f"straggler: rank {self.rank} on {self.host}, its step work {self.ratio:.1f}x the "
            f"median for {self.span_s:.0f} s"
        )

    def as_status(self) -> dict:
        return {
            "rank": self.rank,
            "host": self.host,
            "why": self.why,
            "ratio": round(self.ratio, 2),
            "span_s": round(self.span_s, 1),
            "named_at": self.named_at,
        }


class Stragglers:
    """Each rank's recent work and when it was last heard; names stragglers once each."""

    def __init__(
        self,
        hosts: dict[int, str],
        ratio: float = STRAGGLER_RATIO,
        window_s: float = STRAGGLER_WINDOW_S,
        silent_ratio: float = SILENT_RATIO,
        silent_min_s: float = SILENT_MIN_S,
    ) -> None:
        self.hosts = hosts  # rank -> host
        self.ratio = ratio
        self.window_s = window_s
        self.silent_ratio = silent_ratio
        self.silent_min_s = silent_min_s
        # (t, work x steps, step x steps or None, steps)
        self.work: dict[int, deque[tuple[float, float, float | None, int]]] = {}
        self.heard: dict[int, float] = {}
        self.spoken: dict[int, int] = {}
        self.named: dict[int, Straggler] = {}

    def observe(self, rank: int, metrics: dict, now: float) -> None:
        """A metrics record of `rank` arrived at `now` (its work, if it reports one)."""
        self.heard_from(rank, now)
        work, steps = metrics.get("work_s"), metrics.get("steps", 1)
        if not _number(work) or not _number(steps) or steps <= 0:
            return
        step = metrics.get("step_s")
        window = self.work.setdefault(rank, deque())
        window.append(
            (now, float(work) * steps, float(step) * steps if _number(step) else None, int(steps))
        )
        while window and window[0][0] < now - self.window_s:
            window.popleft()

    def heard_from(self, rank: int, now: float) -> None:
        """`rank` said something (output or metrics) at `now`."""
        self.heard[rank] = now
        self.spoken[rank] = self.spoken.get(rank, 0) + 1

    def mean_work(self, now: float) -> dict[int, tuple[float, float]]:
        """rank -> (mean work per step over the window, the time the window spans)."""
        return {rank: (work, span) for rank, (work, _, span) in self._means(now).items()}

    def _means(self, now: float) -> dict[int, tuple[float, float | None, float]]:
        """rank -> (mean work per step, mean step or None, the time the window spans)."""
        means = {}
        for rank, window in self.work.items():
            while window and window[0][0] < now - self.window_s:
                window.popleft()
            steps = sum(entry[3] for entry in window)
            span = now - window[0][0] if window else 0.0
            if steps and span >= self.window_s * MIN_COVER:
                timed = [entry[2] for entry in window if entry[2] is not None]
                step = sum(timed) / steps if len(timed) == len(window) else None
                means[rank] = (sum(entry[1] for entry in window) / steps, step, span)
        return means

    def slow(self, now: float, running: set[int]) -> dict[int, tuple[float, float]]:
        """The `running` ranks slow now on both signals: rank -> (its work over the other
        ranks' median work, the step over that median)."""
        means = {r: m for r, m in self._means(now).items() if r in running}
        works = sorted(work for work, _, _ in means.values())
        found = {}
        for rank, (work, step, _) in means.items():
            median = median_without(works, work)
            if median is None or median <= 0 or step is None:
                continue
            if work > self.ratio * median and step > self.ratio * median:
                found[rank] = (work / median, step / median)
        return found

    def check(self, now: float, running: set[int]) -> list[Straggler]:
        """Stragglers among the `running` ranks not named before. One sort per measure
        and pass: the loop runs this every second, over every rank."""
        found = []
        means = {r: m for r, m in self.mean_work(now).items() if r in running}
        works = sorted(work for work, _ in means.values())
        for rank, (work, span) in means.items():
            if rank in self.named:
                continue
            median = median_without(works, work)
            if median is not None and median > 0 and work > self.ratio * median:
                found.append(self._name(rank, "work", work / median, span, now))
        silences = {r: now - self.heard[r] for r in running if r in self.heard}
        ordered = sorted(silences.values())
        for rank, silence in silences.items():
            if (
                rank in self.named
                or silence < self.silent_min_s
                or self.spoken.get(rank, 0) < SPOKEN
            ):
                continue
            median = median_without(ordered, silence)
            if median is not None and silence > self.silent_ratio * max(median, 1.0):
                found.append(self._name(rank, "silent", silence / max(median, 1.0), silence, now))
        return found

    def _name(self, rank: int, why: str, ratio: float, span: float, now: float) -> Straggler:
        straggler = Straggler(rank, self.hosts.get(rank, "?"), why, ratio, span, now)
        self.named[rank] = straggler
        return straggler

    def status(self) -> list[dict]:
        return [s.as_status() for s in sorted(self.named.values(), key=lambda s: s.named_at)]


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def median_without(ordered: list[float], value: float) -> float | None:
    """The median of sorted `ordered` with one occurrence of `value` (which it holds) left
    out: the other ranks' median, without building their list for every rank. None when
    nothing is left."""
    k = len(ordered) - 1
    if k <= 0:
        return None
    i = bisect.bisect_left(ordered, value)

    def rest(j: int) -> float:
        return ordered[j] if j < i else ordered[j + 1]

    return rest(k // 2) if k % 2 else (rest(k // 2 - 1) + rest(k // 2)) / 2
