"""Supervision: watch every node's agent; on the first failure, a lost node, Ctrl-C or
SIGTERM, stop the run on every node; decide the outcome and who failed first.

Runs in the controller's main thread. The nodes' readers (one thread for every channel it
can wait on, backends/readers.py) put `Event`s on a queue; signal handlers only set a
flag. Every state change is written to status.json. Each pass of the one loop (run_loop.py:
over SSH the supervisor alone, under SLURM with the follower around it) comes to `step`,
which hands each event to its kind's handler (frame_handlers.py, or first the backend's:
`Watch.hear`), which turns it into a report to the `Detector`; when that says the run must
stop, the `Stopper` stops it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.agent.protocol import CONTROLLER_BEATS, beat_intervals
from orchestrator.attempts.next_attempt import Next
from orchestrator.backends.sessions import Event, NodeSession
from orchestrator.console.rank_table import summary
from orchestrator.console.sink import LogSink
from orchestrator.options.supervision import Supervision
from orchestrator.record.states import NodePhase, RankPhase
from orchestrator.supervise.detect import Detector
from orchestrator.supervise.flight_report import with_flight
from orchestrator.supervise.frame_handlers import handle as handle_event
from orchestrator.supervise.hangs import Hang, HangWatch
from orchestrator.supervise.liveness import Liveness
from orchestrator.supervise.metrics import RunMetrics
from orchestrator.supervise.run_loop import Alone, run_loop
from orchestrator.supervise.stack_rounds import StackRounds
from orchestrator.supervise.state import (
    NodeFault,
    NodeState,
    Outcome,
    RankState,
    describe_exit,
    nodes_and_ranks,
)
from orchestrator.supervise.status_pace import StatusPace
from orchestrator.supervise.stopping import Stopper
from orchestrator.supervise.straggler_swap import StragglerSwap
from orchestrator.supervise.stragglers import Stragglers
from orchestrator.supervise.time_limit import WarningClock

MAX_EVENTS_PER_STEP = 256  # then flush and look at heartbeats and signals again
# The loop wakes on an event at once (while they keep coming, a pass every
# run_loop.PASS_GAP_S); without one, after TICK_S while lines wait to be folded or a stop
# goes on, after FOOTER_TICK_S while a footer is drawn, else after IDLE_TICK_S (at most a
# sixth of the heartbeat timeout), or sooner when a change waits to be told
# (status_pace.py). On a quiet run a pass costs ~0.3 ms of a cold cache whatever the node
# count (16 nodes: a third of the controller's CPU at one a second;
# benchmarks/idle_controller.py), so it comes as seldom as the verdicts allow: liveness
# counts a pass up to MAX_TICK_S (3 s) as time awake.
TICK_S = 0.1
FOOTER_TICK_S = 1.0
IDLE_TICK_S = 2.0


class Supervisor:
    """Drive a started run to its end and say how it ended."""

    def __init__(
        self,
        nodes: Sequence[NodeState],
        ranks: Sequence[RankState],
        sessions: Sequence[NodeSession],
        events: queue.Queue[Event | None],  # None: only a wake-up (see wake)
        sink: LogSink,
        supervision: Supervision,
        *,
        stop_on_failure: bool = True,
        time_limit: float | None = None,  # seconds from now (or a deadline, which holds one)
        deadline: WarningClock | None = None,  # a time limit and the warning before it
        max_restarts: int = 0,
        on_change: Callable[[Supervisor], None] = lambda sup: None,
        metrics_path: Path | None = None,
        probes: dict[int, tuple[float, float]] | None = None,
        record_dir: Path | None = None,  # where stacks are kept and requested (stack_rounds)
        # what a node lost now would lead to (--spares, --min-nodes): a slow node may be
        # taken out at a checkpoint (straggler_swap.py); None: never
        lose_one: Callable[[], Next] | None = None,
    ) -> None:
        self.events = events
        self.sink = sink
        self.ended = threading.Event()  # the run is over: no more heartbeats
        self.beats: threading.Thread | None = None
        self.supervision = supervision
        self.timed_out = False
        self.on_change = on_change
        # Inside a pass, changes are told once, as it ends, and paced (status_pace.py):
        # telling writes status.json, all ranks of it, and a pass may hear hundreds of ranks
        # end (a stop of a large run).
        self.in_pass = False
        self.status_pace = StatusPace(lambda: self.on_change(self))
        self.stopper = Stopper(nodes, sessions, sink, supervision.grace, on_first_stop=self.changed)
        self.detector = Detector(
            nodes,
            ranks,
            sink,
            self.stopper,
            stop_on_failure=stop_on_failure,
            max_restarts=max_restarts,
        )
        self.nodes = self.detector.nodes
        self.ranks = self.detector.ranks
        self.stopper.nodes = self.nodes
        self.started_wall = self.detector.started_wall
        clock = deadline or WarningClock(time_limit, None, self.started_wall)
        self.deadline = self.detector.warning = clock
        self.sessions = sessions  # the caller may still be adding to it while nodes start
        self.session_of: dict[int, NodeSession] = {}
        self.liveness = Liveness(
            self.nodes,
            sessions,
            sink.note,
            supervision.heartbeat_timeout,
            supervision.stall_timeout,
        )
        hosts = {r.rank: r.host for r in ranks}
        ratio, window_s = supervision.stragglers
        self.metrics = RunMetrics(
            metrics_path, hosts, sink.note, Stragglers(hosts, ratio=ratio, window_s=window_s)
        )
        node_hosts = {node.index: node.host for node in self.nodes}
        self.stacks = StackRounds(sessions, hosts, node_hosts, record_dir, sink.note)
        self.hangs = HangWatch(self.stacks, supervision.hang_timeout, sink.note, time.monotonic())
        self.hang: Hang | None = None
        self.metrics.probes(self.nodes, probes or {})
        self.checkpoint_asked: str | None = None  # why the ranks are asked to checkpoint
        self.swap = (
            StragglerSwap(supervision.swap_stragglers_after, lose_one, sink.note)
            if lose_one is not None and supervision.swap_stragglers
            else None
        )

    # --- what callers use ----------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """Whether the run's stop began (what time_limit.Run reads); the rest of the stop's
        state is the stopper's (`stopper.reason`, `stopper.wall`, `stopper.interrupted_by`)."""
        return self.stopper.stopping

    def ask_checkpoint(self, why: str) -> None:
        """From another thread: have the ranks save a checkpoint and end (the warning
        signal, time_limit.WarningClock.checkpoint); the loop sends it."""
        self.checkpoint_asked = why
        self.wake()

    def interrupt(self, signum: int) -> None:
        """Called from a signal handler: only note it; the loop acts on it."""
        self.stopper.interrupt(signum)

    def wake(self) -> None:
        """Wake the loop now (after a signal; from another thread than the handler's)."""
        with contextlib.suppress(queue.Full):
            self.events.put_nowait(None)  # no event: the loop looks at signals and timers

    def begin_stop(self, grace: float, reason: str) -> None:
        if not self.stopping:
            self.metrics.event("stop", detail=reason)
        self.stopper.begin(grace, reason)

    # --- the loop -----------------------------------------------------------------------

    def start_beating(self) -> None:
        """Heartbeats from now on, to every session started so far and any added later:
        called before the nodes start, since starting hundreds of them on a loaded machine
        can take longer than an agent waits to hear from the controller."""
        if self.beats is None:
            self.beats = threading.Thread(target=self._beat, name="heartbeats", daemon=True)
            self.beats.start()

    def run(self) -> Outcome:
        self.changed()
        self.start_beating()
        try:
            run_loop(Alone(self))
            self.take_aside()  # what came with the last frames (a last metrics record)
        finally:
            self.ended.set()
            self.sink.end_footer()
            self.metrics.close()
        self.sink.flush(drain=True)
        outcome = self.outcome()
        self.changed()
        self.status_pace.tell(force=True)  # the last word, however soon after the one before
        return outcome

    def _beat(self) -> None:
        """Heartbeats to every agent from a timer of their own: a busy loop cannot hold
        them back, so a slow controller does not look gone to its nodes. Each round runs
        in a thread of its own: a write the kernel holds (seen at 250 nodes with the
        machine out of memory) holds that round only, and the next round skips the node
        whose heartbeat is still being written (NodeSession.send)."""
        for pause in beat_intervals(self.supervision.heartbeat_timeout, CONTROLLER_BEATS):
            if self.ended.wait(pause):
                return
            self.stopper.heartbeat_round()

    def pause(self) -> float:
        """How long the loop may wait for an event."""
        if self.stopping or self.sink.holding():
            return TICK_S
        idle = IDLE_TICK_S if self.sink.footer is None else FOOTER_TICK_S
        if self.supervision.heartbeat_timeout > 0:
            idle = min(idle, self.supervision.heartbeat_timeout / 6)
        idle = min(idle, self.status_pace.wait())
        return max(TICK_S, min(idle, self.deadline.wait(time.time())))

    def step(
        self, first: Event | None, hear: Callable[[Supervisor, Event], None], drain: bool = False
    ) -> int:
        """One pass of the loop (run_loop.py): the events that came (`first`: the one
        that woke the loop; then those queued, at most MAX_EVENTS_PER_STEP unless `drain`),
        each through `hear`; then the footer, metrics, liveness, signals, lost nodes,
        stacks and hang checks, the time limit and a checkpoint asked for; the changes told
        (all of them, however soon, after a `drain`: an attempt's last pass). How many
        events were handled."""
        self.in_pass = True
        try:
            handled = self._step(first, hear, drain)
        finally:
            self.in_pass = False
        self.status_pace.tell(force=drain)
        return handled

    def _step(
        self, first: Event | None, hear: Callable[[Supervisor, Event], None], drain: bool
    ) -> int:
        self.take_aside()  # first: a reader sets a frame aside before it queues the next
        handled, event = 0, first
        while True:
            if event is not None:
                hear(self, event)
                handled += 1
            if handled >= MAX_EVENTS_PER_STEP and not drain:
                break
            try:
                event = self.events.get_nowait()  # None: a wake-up, nothing to hear
            except queue.Empty:
                break
        if self.sink.footer is not None and all(n.state != NodePhase.STARTING for n in self.nodes):
            self.sink.update_footer(self.footer_text)
        self.sink.flush()
        self.metrics.flush()
        if self.metrics.check(time.time(), self.running_ranks, self.nodes):
            self.changed()
        if self.swap is not None and not self.stopping:
            self.swap_if_slow(time.time())
        # Events still queued: the controller is behind what the nodes said, and
        # silence it has not read yet is not theirs.
        self.liveness.tick(behind=handled >= MAX_EVENTS_PER_STEP)
        self.stopper.handle_signals()
        for node, why, gone in self.liveness.check(self.overdue_by):
            self.node_lost(node, why, gone)
        self.watch_stacks(time.monotonic())
        self.timed_out = self.deadline.tick(self, self.sink, time.time())  # stops at the limit
        asked = self.checkpoint_asked
        if asked is not None and self.deadline.checkpoint(self, self.sink, time.time(), asked):
            self.checkpoint_asked = None
        return handled

    def watch_stacks(self, now: float) -> None:
        """Rounds of stacks: `orchestrator stacks` requests, rounds that ended, hang checks.
        Every pass of the loop comes here: on a quiet run it costs one stat (requests) and
        reads the nodes only while a round or a check is under way."""
        for request, method in self.stacks.requests():
            self.stacks.begin("asked by orchestrator stacks", self.running_nodes(), method, request)
        ended = (
            self.stacks.tick(now, {n.index for n in self.nodes if n.done})
            if self.stacks.open
            else []
        )
        for round_ in ended:
            hang = self.hangs.round_ended(round_, now)
            if hang is None or self.stopping:
                continue
            if not self.hangs.said_or_restarted(hang, self.detector, self.sessions, now):
                self.hang = hang
                self.stop_if(self.detector.hung(hang.summary()))
        if not self.hangs.waiting(now):
            return
        running = self.running_nodes()
        limit = (
            self.supervision.heartbeat_timeout
            if self.supervision.heartbeat_timeout > 0
            else float("inf")
        )
        answering = all(time.time() - n.heard_wall < limit for n in self.nodes)
        everyone = len(running) == len(self.nodes) and answering and not self.stopping
        self.hangs.tick(now, running, everyone)

    def swap_if_slow(self, now: float) -> None:
        """A node slow for the whole bound is due: the ranks are asked for a checkpoint,
        and the attempt that ends at it ends as the node's fault (`swap_due`)."""
        assert self.swap is not None
        slow = lambda: self.metrics.stragglers.slow(now, self.running_ranks())  # noqa: E731
        due = self.swap.check(now, slow, self.nodes)
        if due is not None:
            self.metrics.event("swap", self.nodes[due.index], due.why)
            self.ask_checkpoint(f"taking out slow {due.host}")
            self.changed()

    @property
    def swap_due(self) -> NodeFault | None:
        """The slow node to take out once the ranks stopped at their checkpoint."""
        return self.swap.due if self.swap is not None else None

    def running_nodes(self) -> set[int]:
        """The nodes (by index) whose part runs."""
        return {n.index for n in self.nodes if n.state == NodePhase.RUNNING and not n.done}

    def take_aside(self) -> None:
        """The frames the nodes' readers set aside since the last pass (nodes.ASIDE), each
        handled as it would have been at once: it keeps the time it arrived."""
        for session in self.sessions:
            while session.aside:
                handle_event(self, session.aside.popleft())

    def overdue_by(self, slack: float) -> bool:
        """Stopping, and every agent should have reported `slack` seconds ago."""
        return self.stopper.overdue(time.monotonic() - slack)

    def sent_at(self, index: int) -> float | None:
        """When the controller sent the node its step (wall clock), if it knows."""
        if len(self.session_of) != len(self.sessions):  # sessions are added while starting
            self.session_of = {session.index: session for session in self.sessions}
        return getattr(self.session_of.get(index), "sent_at", None)

    def running_ranks(self) -> set[int]:
        return {rank for rank, state in self.ranks.items() if state.state == RankPhase.RUNNING}

    def on_our_clock(self, node: NodeState, node_time: float) -> float:
        """A time the node reported, in the controller's clock, and never before the run."""
        return max(self.started_wall, node.clock.to_controller(node_time))

    # --- reports: the detector decides, the stopper acts --------------------------------

    def rank_exited(self, rank: int, code: int, when: float, after_stop=None, warned=False):
        if code != 0 and not after_stop and not warned and rank in self.ranks:
            node = self.nodes[self.ranks[rank].node]
            self.metrics.event("failed", node, f"rank {rank}: {describe_exit(code)}", rank=rank)
        self.stop_if(self.detector.rank_exited(rank, code, when, after_stop, warned))

    def node_exited(self, node: NodeState, code: int | None, when: float) -> None:
        self.metrics.event("end", node, describe_exit(code))
        self.stop_if(self.detector.node_exited(node, code, when))

    def node_lost(self, node: NodeState, why: str, gone: bool = True) -> None:
        self.metrics.event("lost", node, why)
        self.stop_if(self.detector.node_lost(node, why, gone))

    def rank_restarted(self, rank: RankState) -> None:
        """Output after a rank's exit: torchrun started it again."""
        rank.state, rank.exit_code, rank.ended_at = RankPhase.RUNNING, None, None
        self.metrics.event("restart", self.nodes[rank.node], f"rank {rank.rank}", rank=rank.rank)
        self.changed()

    # --- what a scheduler decided itself (SLURM: srun, squeue, the job's files) ----------

    def scheduler_stopped(self, reason: str, at: float) -> None:
        """The scheduler stops every node itself (srun's --kill-on-bad-exit), since `at`
        (the wall clock): ranks that end after it were stopped, not failed."""
        self.begin_stop(self.supervision.grace, reason)
        self.stopper.began_at(at)

    def interrupted(self, signum: int) -> None:
        """The run ended on `signum` to the orchestrator (its job cancelled)."""
        self.stopper.interrupted(signum)

    def node_started(self, node: NodeState, at: float) -> None:
        """The node's part runs since `at` (the controller's clock): its agent's S said so,
        or under SLURM its start file where the agent is not reached."""
        node.state, node.started_at = NodePhase.RUNNING, at
        for rank in node.ranks:
            self.ranks[rank].state = RankPhase.RUNNING
        self.metrics.event("start", node)
        self.changed()

    def rank_error_file(self, rank: int, text: str) -> None:
        """The error file a rank left (torch elastic's), as its agent's F frame brings it."""
        self.ranks[rank].error_file = text

    def ended_unreported(self, detail: str) -> None:
        """The scheduler ended the nodes that never reported their end (`detail` says
        how): stopped while the run stops, else failed; their ranks without an exit,
        killed or unknown."""
        for node in self.nodes:
            if not node.done:
                node.done, node.ended_at = True, time.time()
                node.state = NodePhase.STOPPED if self.stopping else NodePhase.FAILED
                node.detail = detail
                for rank in node.ranks:
                    if self.ranks[rank].exit_code is None:
                        self.ranks[rank].state = (
                            RankPhase.KILLED if self.stopping else RankPhase.UNKNOWN
                        )

    def stop_if(self, reason: str | None) -> None:
        """Stop the run when the detector gives a reason; either way, say what changed."""
        if reason is not None:
            self.begin_stop(self.supervision.grace, reason)
        self.changed()

    def changed(self) -> None:
        """Tell the caller (status.json) that the run's state changed: now, or within a
        pass as it ends; later where telling is due only then (status_pace.py)."""
        self.status_pace.changed()
        if not self.in_pass:
            self.status_pace.tell()

    # --- the end ------------------------------------------------------------------------

    def outcome(self) -> Outcome:
        return with_flight(self.detector.outcome(self.timed_out), self.stacks)

    def footer_text(self) -> str:
        """The run in one line, for launch's footer (no hang checks: next_check is quiet_since)."""
        at, h = max(self.metrics.stragglers.heard.values(), default=self.started_wall), self.hangs
        status = {**self.status(), "state": "stopping" if self.stopping else "running"}
        return summary(status, self.metrics.latest, time.time() - at, h.next_check - h.quiet_since)

    def status(self) -> dict:
        """The supervision part of status.json."""
        return {
            **self.metrics.status(),
            "stopping": self.stopping,
            "stop_reason": self.stopper.reason or None,
            "restarts": len(self.detector.rounds.restarts(self.detector.gave_up)),
            "restart_causes": self.detector.restart_lines(),
            **nodes_and_ranks(self.nodes, self.ranks.values()),
            **self.deadline.status(),
            **({"hang": self.hang.status()} if self.hang is not None else {}),
            # the lines that named the nodes that could not reach another (unreachable.py)
            **({"unreachable": lines} if (lines := self.detector.unreachable_lines) else {}),
        }
