"""Supervision: watch every node's agent; on the first failure, a lost node, Ctrl-C or
SIGTERM, stop the run on every node; decide the outcome and who failed first.

Runs in the controller's main thread. Reader threads (one per node) put `Event`s on a
queue; signal handlers only set a flag. Every state change is written to status.json.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from orchestrator.logs import LogSink
from orchestrator.nodes import Event, NodeSession
from orchestrator.runs import now_iso

HEARTBEAT_S = 1.0
STOP_MARGIN_S = 10.0  # how long past the grace an agent may take to report before it is lost


@dataclass
class RankState:
    rank: int
    node: int
    local_rank: int
    host: str
    state: str = "starting"  # running, succeeded, failed, stopped, killed
    exit_code: int | None = None
    ended_at: float | None = None  # wall clock of the node
    error_file: str = ""


@dataclass
class NodeState:
    index: int
    host: str
    ranks: tuple[int, ...] = ()
    state: str = "starting"  # running, succeeded, failed, stopped, lost
    exit_code: int | None = None
    pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    last_heard: float = field(default_factory=time.monotonic)
    detail: str = ""
    done: bool = False


@dataclass
class Outcome:
    state: str  # succeeded, failed, stopped, lost
    exit_code: int
    summary: str = ""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status (killed or lost)"
    if code > 128 and code - 128 < signal.NSIG:
        try:
            return f"signal {signal.Signals(code - 128).name} (exit code {code})"
        except ValueError:
            pass
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


class Supervisor:
    """Drive a started run to its end and say how it ended."""

    def __init__(self, nodes: Sequence[NodeState], ranks: Sequence[RankState],
                 sessions: Sequence[NodeSession], events: queue.Queue[Event], sink: LogSink,
                 *, grace: float, heartbeat_timeout: float, stop_on_failure: bool = True,
                 time_limit: float | None = None,
                 on_change: Callable[[Supervisor], None] = lambda sup: None) -> None:
        self.nodes = list(nodes)
        self.ranks = {r.rank: r for r in ranks}
        self.sessions = sessions  # the caller may still be adding to it while nodes start
        self.events = events
        self.sink = sink
        self.grace = grace
        self.heartbeat_timeout = heartbeat_timeout
        self.stop_on_failure = stop_on_failure
        self.time_limit = time_limit
        self.timed_out = False
        self.on_change = on_change
        self.started_wall = time.time()
        self.stopping = False
        self.stop_reason = ""
        self.stop_wall: float | None = None
        self.stop_deadline = 0.0
        self.signal_count = 0
        self.pending_signals: list[int] = []
        self.interrupted_by: int | None = None

    # --- control from outside (signal handlers) -----------------------------------------

    def interrupt(self, signum: int) -> None:
        """Called from a signal handler: only note it; the loop acts on it."""
        self.pending_signals.append(signum)

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> Outcome:
        last_hb = time.monotonic()
        self.on_change(self)
        while not all(node.done for node in self.nodes):
            try:
                event: Event | None = self.events.get(timeout=0.1)
            except queue.Empty:
                event = None
            handled = 0
            while event is not None:
                self.handle(event)
                handled += 1
                if handled >= 256:
                    break
                try:
                    event = self.events.get_nowait()
                except queue.Empty:
                    event = None
            self.sink.flush()
            now = time.monotonic()
            if now - last_hb >= HEARTBEAT_S:
                last_hb = now
                for session in self.sessions:
                    if not self.nodes[session.index].done:
                        session.send("hb")
            self.handle_signals()
            self.check_silence(now)
            if self.time_limit is not None and not self.timed_out and \
                    time.time() - self.started_wall > self.time_limit:
                self.timed_out = True
                self.begin_stop(0, f"time limit of {self.time_limit:g} s reached")
        self.sink.flush()
        outcome = self.outcome()
        self.on_change(self)
        return outcome

    def handle_signals(self) -> None:
        while self.pending_signals:
            signum = self.pending_signals.pop(0)
            self.signal_count += 1
            self.interrupted_by = self.interrupted_by or signum
            name = signal.Signals(signum).name
            if self.signal_count == 1:
                self.sink.note(f"{name}: stopping the run on every node "
                               f"(grace {self.grace:g} s; Ctrl-C again to kill at once)")
                self.begin_stop(self.grace, f"{name} to the orchestrator")
            else:
                self.sink.note(f"{name} again: killing every process of the run now")
                self.begin_stop(0, f"{name} twice")

    def check_silence(self, now: float) -> None:
        for node in self.nodes:
            if node.done:
                continue
            silent = now - node.last_heard
            if self.heartbeat_timeout > 0 and silent > self.heartbeat_timeout:
                self.node_lost(node, f"no word from its agent for {silent:.0f} s "
                               "(link down, node or sshd gone?)")
            elif self.stopping and now > self.stop_deadline:
                self.node_lost(node, "its agent did not report back after the stop")

    def begin_stop(self, grace: float, reason: str) -> None:
        first = not self.stopping
        if first:
            self.stopping = True
            self.stop_reason = reason
            self.stop_wall = time.time()
        self.stop_deadline = time.monotonic() + grace + STOP_MARGIN_S
        for session in self.sessions:
            if not self.nodes[session.index].done:
                session.send("kill" if grace <= 0 else f"stop {grace:g}")
        if first:
            self.on_change(self)

    # --- events -------------------------------------------------------------------------

    def handle(self, event: Event) -> None:
        node = self.nodes[event.node]
        node.last_heard = time.monotonic()
        kind = event.kind
        if kind == "O":
            self.sink.rank_output(int(event.fields[0]), event.data)
        elif kind == "N":
            self.sink.node_output(node.index, event.data)
        elif kind == "H":
            pass
        elif kind == "M":
            self.sink.note(f"{node.host}: {event.data.decode(errors='replace').strip()}")
        elif kind == "S":
            node.state, node.pid, node.started_at = "running", int(event.fields[0]), \
                float(event.fields[1])
            for rank in node.ranks:
                self.ranks[rank].state = "running"
            self.on_change(self)
        elif kind == "F":
            self.ranks[int(event.fields[0])].error_file = event.data.decode(errors="replace")
        elif kind == "E":
            self.rank_exited(int(event.fields[0]), int(event.fields[1]), float(event.fields[2]))
        elif kind == "X":
            self.node_exited(node, int(event.fields[0]) if event.fields[0] != "None" else None,
                             float(event.fields[1]))
        elif kind == "EOF" and not node.done:
            detail = event.data.decode(errors="replace").strip()
            self.node_lost(node, "its agent ended without reporting"
                           + (f": {detail.splitlines()[-1]}" if detail else ""))

    def rank_exited(self, rank: int, code: int, when: float) -> None:
        state = self.ranks[rank]
        state.exit_code, state.ended_at = code, when
        if code == 0:
            state.state = "succeeded"
        elif self.stopping and self.stop_wall is not None and when >= self.stop_wall:
            state.state = "stopped"
        else:
            state.state = "failed"
            if self.stop_on_failure and not self.stopping:
                self.sink.note(f"rank {rank} on {state.host} failed with "
                               f"{describe_exit(code)}; stopping the run on every node")
                self.begin_stop(self.grace, f"rank {rank} on {state.host} failed")
        self.on_change(self)

    def node_exited(self, node: NodeState, code: int | None, when: float) -> None:
        node.done, node.exit_code, node.ended_at = True, code, when
        for rank in node.ranks:
            if self.ranks[rank].exit_code is None and self.ranks[rank].state != "failed":
                self.ranks[rank].state = "killed" if self.stopping else "unknown"
        if code == 0:
            node.state = "succeeded"
        elif self.stopping:
            node.state = "stopped"
        else:
            node.state = "failed"
            if self.stop_on_failure:
                self.sink.note(f"{node.host}: node script ended with {describe_exit(code)}; "
                               "stopping the run on every node")
                self.begin_stop(self.grace, f"{node.host} failed")
        self.on_change(self)

    def node_lost(self, node: NodeState, why: str) -> None:
        node.done, node.state, node.detail = True, "lost", why
        node.ended_at = time.time()
        for rank in node.ranks:
            if self.ranks[rank].exit_code is None:
                self.ranks[rank].state = "unknown"
        self.sink.note(f"{node.host}: lost: {why}")
        if not self.stopping:
            self.begin_stop(self.grace, f"{node.host} lost")
        self.on_change(self)

    # --- the end ------------------------------------------------------------------------

    def first_failed_rank(self) -> RankState | None:
        failed = [r for r in self.ranks.values() if r.state == "failed"]
        return min(failed, key=lambda r: (r.ended_at or float("inf"), r.rank), default=None)

    def outcome(self) -> Outcome:
        if self.interrupted_by is not None:
            return Outcome("stopped", 128 + self.interrupted_by,
                           f"stopped by {signal.Signals(self.interrupted_by).name}")
        rank = self.first_failed_rank()
        if rank is not None:
            return Outcome("failed", rank.exit_code or 1, self.rank_summary(rank))
        if self.timed_out:
            return Outcome("failed", 124, f"stopped: {self.stop_reason}")
        failed = [n for n in self.nodes if n.state in ("failed", "lost")]
        if failed:
            first = min(failed, key=lambda n: n.ended_at or float("inf"))
            state = "lost" if first.state == "lost" else "failed"
            code = first.exit_code if first.state == "failed" and first.exit_code else 1
            return Outcome(state, code, self.node_summary(first))
        return Outcome("succeeded", 0)

    def rank_summary(self, rank: RankState) -> str:
        elapsed = (rank.ended_at or time.time()) - self.started_wall
        lines = [f"job failed: rank {rank.rank} (local rank {rank.local_rank}) on {rank.host} "
                 f"ended with {describe_exit(rank.exit_code)} after {elapsed:.1f} s "
                 "(the first rank to fail)"]
        tail = self.sink.last_lines(rank=rank.rank)
        lines.append(f"last {len(tail)} line(s) of rank {rank.rank}:" if tail
                     else f"rank {rank.rank} printed nothing")
        lines += [f"  {line}" for line in tail]
        if rank.error_file:
            lines.append(f"torch error file of rank {rank.rank}:")
            lines += [f"  {line}" for line in rank.error_file.strip().splitlines()[-20:]]
        return "\n".join(lines)

    def node_summary(self, node: NodeState) -> str:
        if node.state == "lost":
            head = f"job failed: node {node.host} was lost: {node.detail}"
        else:
            head = f"job failed: the node script on {node.host} ended with " \
                   f"{describe_exit(node.exit_code)} before any rank failed"
        tail = self.sink.last_lines(node=node.index)
        lines = [head] + ([f"last {len(tail)} line(s) from {node.host}:"] if tail else [])
        return "\n".join(lines + [f"  {line}" for line in tail])

    def status(self) -> dict:
        """The supervision part of status.json."""
        def when(t: float | None) -> str | None:
            return now_iso(t) if t is not None else None

        return {
            "stopping": self.stopping,
            "stop_reason": self.stop_reason or None,
            "nodes": [
                {"node_rank": n.index, "host": n.host, "state": n.state,
                 "exit_code": n.exit_code, "pid": n.pid, "started_at": when(n.started_at),
                 "ended_at": when(n.ended_at), "detail": n.detail or None}
                for n in self.nodes
            ],
            "ranks": [
                {"rank": r.rank, "node_rank": r.node, "local_rank": r.local_rank,
                 "host": r.host, "state": r.state, "exit_code": r.exit_code,
                 "ended_at": when(r.ended_at)}
                for r in sorted(self.ranks.values(), key=lambda r: r.rank)
            ],
        }


@contextlib.contextmanager
def signals_to(supervisor: Supervisor) -> Iterator[None]:
    """Route SIGINT/SIGTERM to the supervisor for the duration of a run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, lambda num, _frame: supervisor.interrupt(num))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
