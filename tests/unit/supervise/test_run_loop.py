"""The one loop (orchestrator.supervise.run_loop): events that keep coming are taken
together, at most a pass every PASS_GAP_S; an event after a quiet spell at once."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from types import SimpleNamespace

from orchestrator.supervise import run_loop as loop
from orchestrator.supervise.run_loop import PASS_GAP_S, run_loop


class Watched:
    """A watch and its attempt in one: each pass takes what is queued, notes when it
    began, and `after` it queues what `next_events` says (or ends the run)."""

    def __init__(self, next_events) -> None:
        self.events: queue.Queue = queue.Queue()
        self.nodes: list = []
        self.passes: list[tuple[float, int]] = []  # (began, events taken)
        self.next_events = next_events

    def current(self):
        return self

    def over(self) -> bool:
        return self.next_events is None

    def pause(self, now: float | None = None) -> float:
        return 5.0

    def before(self, now: float) -> None:
        pass

    def step(self, first, hear) -> int:
        taken = [first] if first is not None else []
        while True:
            try:
                taken.append(self.events.get_nowait())
            except queue.Empty:
                break
        self.passes.append((time.monotonic(), len(taken)))
        return len(taken)

    def hear(self, sup, event) -> None:
        pass

    def after(self, handled: int) -> None:
        self.next_events(self)


def test_events_that_keep_coming_wait_for_the_gap_and_are_taken_together(monkeypatch) -> None:
    slept: list[float] = []
    sleep = lambda s: (slept.append(s), time.sleep(s))  # noqa: E731
    monkeypatch.setattr(loop, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))

    def more(watch: Watched) -> None:
        if len(watch.passes) == 5:
            watch.next_events = None
            return
        watch.events.put("line")  # the next frame is there as the pass ends
        watch.events.put("line")

    watch = Watched(more)
    watch.events.put("first")
    run_loop(watch)
    began = [at for at, _ in watch.passes]
    assert [n for _, n in watch.passes] == [1, 2, 2, 2, 2]
    assert len(slept) == 4 and all(0 < s <= PASS_GAP_S for s in slept), slept
    assert all(b - a >= PASS_GAP_S for a, b in itertools.pairwise(began)), began


def test_an_event_after_a_quiet_spell_is_taken_at_once(monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(loop, "time", SimpleNamespace(monotonic=time.monotonic, sleep=slept.append))

    def later(watch: Watched) -> None:
        if len(watch.passes) == 3:
            watch.next_events = None
            return
        threading.Timer(20 * PASS_GAP_S, watch.events.put, ["line"]).start()  # a reader's

    watch = Watched(later)
    watch.events.put("first")
    run_loop(watch)
    assert [n for _, n in watch.passes] == [1, 1, 1] and slept == []
