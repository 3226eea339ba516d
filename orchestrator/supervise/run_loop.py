"""The one supervision loop, for every backend.

Each pass waits for an event from the nodes (a frame, a closed channel, a wake-up after a
signal) or for the next pass to be due, then: the backend's own facts (`Watch.before`: under
SLURM the signals to the orchestrator, squeue, the batch script's output, the files of nodes
whose agent is not reached), the attempt's supervisor's pass (`Supervisor.step`: the frames,
each through `Watch.hear`, the footer, metrics, liveness, stacks and hang checks, the time
limit), then what the backend decides after it (`Watch.after`: under SLURM a cancel for a hang,
the job's end, the next job). Over SSH and on this machine the supervisor is the whole run
(`Alone`); under SLURM the follower (orchestrator.slurm.following.follow) is the watch, and
the attempt it follows may change between passes or be none while the job is queued.

While events keep coming, passes come at most every PASS_GAP_S: an event within that of the
last pass's end waits for the rest of it, and the events meanwhile are taken together. A
pass looks at every node (liveness, the footer, stacks and hang checks): at 1 000 nodes a
pass per frame of ranks printing a line a second each was most of the controller's CPU. An
event after a quiet spell is taken at once.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from orchestrator.backends.sessions import Event
from orchestrator.supervise.frame_handlers import handle as handle_event
from orchestrator.supervise.state import NodeState

PASS_GAP_S = 0.01  # between passes while events keep coming: a console's lines 10 ms later


class Attempt(Protocol):
    """What the loop asks of an attempt's supervisor (supervisor.Supervisor)."""

    events: queue.Queue[Event | None]
    nodes: Sequence[NodeState]

    def pause(self) -> float: ...

    def step(self, first: Event | None, hear: Callable[[Any, Event], None]) -> int: ...


class Watch(Protocol):
    """What a backend brings to the loop."""

    @property
    def events(self) -> queue.Queue[Event | None]:
        """Where the attempt's events come (None: a wake-up)."""
        ...

    def current(self) -> Attempt | None:
        """The supervisor of the attempt followed now; None while none runs (queued)."""
        ...

    def over(self) -> bool:
        """The run is over: the loop ends."""
        ...

    def pause(self, now: float) -> float:
        """The longest the loop may wait for the backend's next pass (monotonic `now`)."""
        ...

    def before(self, now: float) -> None:
        """The backend's own facts, before the supervisor's pass (may change the attempt)."""
        ...

    def hear(self, sup: Any, event: Event) -> None:
        """One event of the attempt's, handed on."""
        ...

    def after(self, handled: int) -> None:
        """After the supervisor's pass (`handled`: how many events it took)."""
        ...


def run_loop(watch: Watch) -> None:
    """Pass after pass until the watch says the run is over."""
    ended = float("-inf")  # the last pass, monotonic
    while not watch.over():
        sup, events = watch.current(), watch.events
        pause = watch.pause(time.monotonic())
        if sup is not None:
            pause = min(pause, sup.pause())
        try:
            event: Event | None = events.get(timeout=max(0.0, pause))
        except queue.Empty:
            event = None
        else:
            early = ended + PASS_GAP_S - time.monotonic()
            if early > 0:  # events keep coming: those of the rest of the gap come too
                time.sleep(early)
        watch.before(time.monotonic())
        current, handled = watch.current(), 0
        if current is not None:  # an event of an attempt that ended meanwhile is dropped
            handled = current.step(event if current is sup else None, watch.hear)
        watch.after(handled)
        ended = time.monotonic()


class Alone:
    """The supervisor is the whole run (SSH, this machine): its nodes' events, its pauses,
    the frame handlers as they are; over once every node is done."""

    def __init__(self, sup: Attempt) -> None:
        self.sup = sup

    @property
    def events(self) -> queue.Queue[Event | None]:
        return self.sup.events

    def current(self) -> Attempt:
        return self.sup

    def over(self) -> bool:
        return all(node.done for node in self.sup.nodes)

    def pause(self, now: float) -> float:
        return float("inf")

    def before(self, now: float) -> None:
        pass

    def hear(self, sup: Any, event: Event) -> None:
        handle_event(sup, event)

    def after(self, handled: int) -> None:
        pass
