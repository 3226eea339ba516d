"""What the supervisor does with each kind of frame a node's agent sends: one small handler a
kind (orchestrator.agent.protocol.Frame), found in `HANDLERS`, and one for a session whose
channel closed.

A handler is given the run, the node the frame came from and the event; the node's
`heard_wall` is already the time the frame arrived. It reports to the run, which decides
(the detector) and acts (the stopper).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from orchestrator.agent.protocol import Frame
from orchestrator.backends.sessions import CHANNEL_CLOSED, Event
from orchestrator.console.sink import LogSink
from orchestrator.record.states import RankPhase
from orchestrator.supervise.detect import Detector
from orchestrator.supervise.hangs import HangWatch
from orchestrator.supervise.metrics import RunMetrics
from orchestrator.supervise.stack_rounds import StackRounds
from orchestrator.supervise.state import NodeState, RankState, disk_error
from orchestrator.supervise.time_limit import WarningClock
from orchestrator.supervise.unreachable import NoAnswer, parse_addresses


class SupervisedRun(Protocol):
    """What the handlers need of the supervisor."""

    nodes: list[NodeState]
    ranks: dict[int, RankState]
    sink: LogSink
    metrics: RunMetrics
    hangs: HangWatch
    stacks: StackRounds
    detector: Detector
    deadline: WarningClock

    def changed(self) -> None: ...

    def stop_if(self, reason: str | None) -> None: ...

    def sent_at(self, index: int) -> float | None: ...

    def on_our_clock(self, node: NodeState, node_time: float) -> float: ...

    def rank_restarted(self, rank: RankState) -> None: ...

    def node_started(self, node: NodeState, at: float) -> None: ...

    def rank_exited(
        self, rank: int, code: int, when: float, after_stop: bool | None, warned: bool
    ) -> None: ...

    def node_exited(self, node: NodeState, code: int | None, when: float) -> None: ...

    def node_lost(self, node: NodeState, why: str, gone: bool = True) -> None: ...


Handler = Callable[[SupervisedRun, NodeState, Event], None]


def handle(run: SupervisedRun, event: Event) -> None:
    """Note that the node was heard, then hand the event to its kind's handler; a kind this
    controller does not know (an agent of another version's) is heard and left at that."""
    node = run.nodes[event.node]
    node.heard_wall = max(node.heard_wall, event.at or time.time())
    handler = HANDLERS.get(event.kind)
    if handler is not None:
        handler(run, node, event)


def started(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """S pid t [addrs]: the node script runs; its start brackets the node's clock; addrs
    are the node's addresses (unreachable.py)."""
    pid, node_time = event.fields[0], float(event.fields[1])
    if len(event.fields) > 2:
        node.addresses = parse_addresses(event.fields[2])
    sent = run.sent_at(node.index)
    if sent is not None:
        node.clock.bracket(sent, node_time, node.heard_wall)
    node.pid = int(pid)
    run.node_started(node, run.on_our_clock(node, node_time))


def rank_output(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """O rank: a rank's lines (a sign of life, not progress: hangs.py); output after its
    exit means torchrun started it again."""
    rank = int(event.fields[0])
    run.hangs.heard(time.monotonic())
    run.sink.rank_output(rank, event.data)
    run.metrics.heard_from(rank, node.heard_wall)
    if rank in run.ranks and run.ranks[rank].state == RankPhase.RESTARTING:
        run.rank_restarted(run.ranks[rank])


def script_output(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """N q: q=1, torchrun after a stop or after its ranks all exited 0: the node log only."""
    run.sink.node_output(node.index, event.data, console=event.fields[:1] != ("1",))


def rank_exited(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """E rank rc t [s]: s=1, the rank ended after the agent began stopping the step."""
    fields = event.fields
    after_stop = fields[3] == "1" if len(fields) > 3 else None
    at = float(fields[2])
    when = run.on_our_clock(node, at)
    warned = run.deadline.after(node.index, at)  # after the time limit's warning
    run.rank_exited(int(fields[0]), int(fields[1]), when, after_stop, warned)


def error_file(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """F rank: the rank's error file, for the failure's summary."""
    run.ranks[int(event.fields[0])].error_file = event.data.decode(errors="replace")


def message(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """M: a message from the agent, a note about its node."""
    run.sink.node_note(node.host, event.data.decode(errors="replace").strip())


def heartbeat(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """H t3 t1 t2: with an echo of our `hb` (t1 not `-`), one round trip for the clocks."""
    if len(event.fields) == 3 and event.fields[1] != "-":
        t3, t1, t2 = (float(f) for f in event.fields)
        node.clock.exchange(t1, t2, t3, event.at or node.heard_wall)


def finished(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """X rc t: the node's step ended (rc `None`: the script's code is unknown)."""
    code = int(event.fields[0]) if event.fields[0] != "None" else None
    run.node_exited(node, code, run.on_our_clock(node, float(event.fields[1])))


def disk_fault(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """W ERRNO t + the directory: the node cannot write its files."""
    what = f"{disk_error(event.fields[0])} in {event.data.decode(errors='replace')}"
    when = run.on_our_clock(node, float(event.fields[1]))
    run.stop_if(run.detector.node_disk(node, what, when))


def metrics(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """Q rank: whole lines of the rank's metrics channel; a new step is progress (hangs.py)."""
    stepped = run.metrics.rank_lines(node, int(event.fields[0]), event.data, node.heard_wall)
    (run.hangs.progressed if stepped else run.hangs.heard)(time.monotonic())


def node_sample(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """P: what the node's processes use (CPU, memory, GPUs)."""
    run.metrics.node_sample(node, event.data, node.heard_wall)


def stacks(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """K seq: the stacks a round asked for."""
    run.stacks.received(node.index, event.fields[0], event.data)


def flight_dump(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """L seq rank ok|no: a rank's flight recorder, for that round."""
    if len(event.fields) == 3:
        run.stacks.dumped(*event.fields, event.data)


def time_warning(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """G SIG t sent skipped: the agent sent the time limit's warning."""
    if len(event.fields) == 4:
        run.deadline.signalled_on(node, run.sink, *event.fields[1:])


def no_answer(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """U addr port s store|peer who: the node's processes cannot reach the store or a peer."""
    if len(event.fields) >= 5:
        run.stop_if(run.detector.unreachable(NoAnswer.of(run.nodes, node, event.fields)))


def channel_closed(run: SupervisedRun, node: NodeState, event: Event) -> None:
    """The agent's channel closed: a node that had not finished is lost."""
    if node.done:
        return
    detail = event.data.decode(errors="replace").strip()
    why = "its agent ended without reporting"
    run.node_lost(node, why + (f": {detail.splitlines()[-1]}" if detail else ""))


HANDLERS: dict[str, Handler] = {
    Frame.STARTED: started,
    Frame.RANK_OUTPUT: rank_output,
    Frame.SCRIPT_OUTPUT: script_output,
    Frame.RANK_EXITED: rank_exited,
    Frame.ERROR_FILE: error_file,
    Frame.MESSAGE: message,
    Frame.HEARTBEAT: heartbeat,
    Frame.FINISHED: finished,
    Frame.DISK_FAULT: disk_fault,
    Frame.METRICS: metrics,
    Frame.NODE_SAMPLE: node_sample,
    Frame.STACKS: stacks,
    Frame.FLIGHT_DUMP: flight_dump,
    Frame.TIME_WARNING: time_warning,
    Frame.NO_ANSWER: no_answer,
    CHANNEL_CLOSED: channel_closed,
}
