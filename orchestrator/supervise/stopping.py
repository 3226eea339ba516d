"""Stopping a run: once, on every node still running, with a grace or at once; and
Ctrl-C / SIGTERM to the orchestrator, which signal handlers only note for the loop."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from orchestrator.agent.protocol import heartbeat_command, kill_command, stop_command
from orchestrator.supervise.state import NodeState

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each stops the run
STOP_MARGIN_S = 10.0  # how long past the grace an agent may take to report before it is lost


class Session(Protocol):
    """The one thing stopping needs of a node's agent session: a command line to it."""

    index: int

    def send(self, line: str, may_skip: bool = False) -> None: ...


class Notes(Protocol):
    def note(self, text: str) -> None: ...


class Stopper:
    """Sends `stop GRACE` / `kill` to every node still running, and handles signals."""

    def __init__(
        self,
        nodes: Sequence[NodeState],
        sessions: Sequence[Session],
        notes: Notes,
        grace: float,
        on_first_stop: Callable[[], None] = lambda: None,
    ) -> None:
        self.nodes = nodes
        self.sessions = sessions  # the caller may still be adding to it while nodes start
        self.notes = notes
        self.grace = grace
        self.on_first_stop = on_first_stop
        self.stopping = False
        self.reason = ""
        self.wall: float | None = None  # when the stop began (wall clock)
        self.deadline = 0.0  # monotonic: every agent should have reported by then
        self.signal_count = 0
        self.pending_signals: list[int] = []
        self.interrupted_by: int | None = None

    def interrupt(self, signum: int) -> None:
        """Called from a signal handler: only note it; the loop acts on it."""
        self.pending_signals.append(signum)

    def begin(self, grace: float, reason: str) -> None:
        """Stop every node still running; a later call may only shorten the grace."""
        first = not self.stopping
        if first:
            self.stopping = True
            self.reason = reason
            self.wall = time.time()
        self.deadline = time.monotonic() + grace + STOP_MARGIN_S
        for session in self.sessions:
            if not self.nodes[session.index].done:
                session.send(kill_command() if grace <= 0 else stop_command(grace))
        if first:
            self.on_first_stop()

    def handle_signals(self) -> None:
        """The first Ctrl-C/SIGTERM stops with the grace; the second kills at once."""
        while self.pending_signals:
            signum = self.pending_signals.pop(0)
            self.signal_count += 1
            self.interrupted_by = self.interrupted_by or signum
            name = signal.Signals(signum).name
            if self.signal_count == 1:
                self.notes.note(
                    f"{name}: stopping the run on every node "
                    f"(grace {self.grace:g} s; Ctrl-C again to kill at once)"
                )
                self.begin(self.grace, f"{name} to the orchestrator")
            else:
                self.notes.note(f"{name} again: killing every process of the run now")
                self.begin(0, f"{name} twice")

    def began_at(self, wall: float) -> None:
        """The stop began at `wall` (the wall clock), not when it was noted here: a
        scheduler stopped the nodes itself then (srun's --kill-on-bad-exit), so exits after
        it are the stop's."""
        self.wall = wall

    def interrupted(self, signum: int) -> None:
        """The run was ended by `signum` to the orchestrator, acted on elsewhere (a SLURM
        job cancelled on Ctrl-C): the outcome names it."""
        self.interrupted_by = signum

    def overdue(self, now: float) -> bool:
        """Stopping, and past the time by which every agent should have reported."""
        return self.stopping and now > self.deadline

    def caused(self, when: float) -> bool:
        """Whether an exit at wall-clock `when` came after the stop began (so from it)."""
        return self.stopping and self.wall is not None and when >= self.wall

    def heartbeat_round(self) -> None:
        """One round of heartbeats in a thread of its own (see Supervisor._beat)."""
        threading.Thread(target=self.heartbeat, name="beat", daemon=True).start()

    def heartbeat(self) -> None:
        """`hb T1`: the controller's clock, which the agent echoes (see clocks.py)."""
        for session in self.sessions:
            if not self.nodes[session.index].done:
                session.send(heartbeat_command(time.time()), may_skip=True)


@contextlib.contextmanager
def signals_to(target: Stopper | object) -> Iterator[None]:
    """Route SIGINT/SIGTERM/SIGHUP to `target.interrupt` for the duration of a run: a
    closed terminal (SIGHUP) stops the run as orderly as Ctrl-C, and leaves its record.

    The handler only notes the signal; a loop that sleeps long while nothing happens is
    woken by `target.wake()`, called from a thread of its own that the signal's wake-up
    byte (signal.set_wakeup_fd) rouses, never from the handler itself (which may run while
    the loop holds the very lock a wake-up would need)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in STOP_SIGNALS:
        previous[signum] = signal.signal(signum, lambda num, _frame: target.interrupt(num))
    wake = getattr(target, "wake", None)
    relay = _WakeRelay(wake) if wake is not None else None
    try:
        yield
    finally:
        if relay is not None:
            relay.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _WakeRelay:
    """A pipe the interpreter writes a byte to on each signal, and a thread that calls
    `wake` for each."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.previous = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.wake = wake
        self.thread = threading.Thread(target=self._relay, name="signal-wake", daemon=True)
        self.thread.start()

    def _relay(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, 64)
            except OSError:
                return
            if not data:  # closed: the run is over
                return
            self.wake()

    def close(self) -> None:
        signal.set_wakeup_fd(self.previous)
        os.close(self.write_fd)
        self.thread.join(timeout=5)
        os.close(self.read_fd)
