"""What the tests build the same way everywhere: a supervisor of a small world (its nodes,
ranks, sessions, sink and supervision, each with a default a keyword overrides), and the
doubles beside it (a node agent's session, the notes a sink takes, a clock the test moves),
a free port on loopback and a wait for a condition. A test file builds from here rather
than writing its own; what only one file needs stays in that file."""

from __future__ import annotations

import queue
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator.backends.sessions import Event
from orchestrator.console.sink import LogSink
from orchestrator.options.supervision import Supervision
from orchestrator.supervise import NodeState, RankState, Supervisor

# The supervision most tests of the loop run under: no hang checks, a heartbeat timeout
# no test reaches, a grace the stop lines show (`stop 3`).
SUPERVISION = Supervision(grace=3, heartbeat_timeout=30, hang_timeout=0)


def world(
    hosts: Sequence[str] = ("a", "b"), nproc: int = 2
) -> tuple[list[NodeState], list[RankState]]:
    """A node for each of `hosts`, `nproc` ranks on each, numbered node after node."""
    nodes, ranks = [], []
    for k, host in enumerate(hosts):
        on_node = tuple(range(k * nproc, (k + 1) * nproc))
        nodes.append(NodeState(k, host, on_node))
        ranks += [RankState(rank, k, local, host) for local, rank in enumerate(on_node)]
    return nodes, ranks


def supervisor(
    logs: Path | None,
    hosts: Sequence[str] = ("a", "b"),
    nproc: int = 2,
    *,
    nodes: list[NodeState] | None = None,
    ranks: list[RankState] | None = None,
    sessions: Sequence[Any] | None = None,
    events: queue.Queue[Event | None] | None = None,
    label: str = "r{rank}",
    supervision: Supervision = SUPERVISION,
    **keywords: Any,
) -> Supervisor:
    """A Supervisor of `world(hosts, nproc)` (or of the `nodes` and `ranks` given), its sink
    writing the ranks' logs to `logs` (None: no files) under labels made by `label` from
    each rank's `rank` and `host`. No sessions and a queue of its own unless given (a list
    given is used as it is: who fills it later fills the supervisor's); `keywords` are the
    Supervisor's own (stop_on_failure, deadline, max_restarts, on_change, ...)."""
    if nodes is None or ranks is None:
        nodes, ranks = world(hosts, nproc)
    labels = {r.rank: label.format(rank=r.rank, host=r.host) for r in ranks}
    sink = LogSink(logs, labels, {node.index: node.host for node in nodes}, None, False)
    return Supervisor(
        nodes,
        ranks,
        [] if sessions is None else sessions,
        queue.Queue() if events is None else events,
        sink,
        supervision,
        **keywords,
    )


class FakeSession:
    """A node agent's session as the controller's parts see it: the lines sent to it; it
    answers and its kernel acknowledges; `channel`, where given, is what a SLURM follower
    reads of the session's channel."""

    def __init__(self, index: int = 0, channel: object = None) -> None:
        self.index = index
        self.channel = channel
        self.sent: list[str] = []
        self.heard = time.monotonic()  # liveness reads it once a pass comes 0.5 s late
        self.aside: deque = deque()  # frames its reader set aside (none here)

    def send(self, line: str, may_skip: bool = False) -> None:
        self.sent.append(line)

    def answers(self) -> bool:
        return True

    def acknowledged(self, within: float) -> bool | None:
        return True


class Notes:
    """What a sink is told outside the ranks' lines, kept in order."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    def node_note(self, host: str, text: str) -> None:
        self.notes.append(f"{host}: {text}")

    def last_lines(self, rank: int | None = None, node: int | None = None) -> list[str]:
        return [f"line of rank {rank}"] if rank is not None else [f"line of node {node}"]


class FakeClock:
    """A clock that moves only when the test moves `now`: called, or as `monotonic()`."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (as the kernel gave it just now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(
    condition: Callable[[], object],
    timeout: float = 10.0,
    what: str = "the condition",
    poll: float = 0.05,
) -> Any:
    """Ask `condition()` every `poll` s until it is truthy, and return what it said; fail
    the test, naming `what`, once `timeout` s have gone by."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)
    return value


def hear_agents(agents: Any, sup: Any, judge: Any, running: bool) -> int:
    """One pass of the loop that hears every frame queued for a SLURM attempt's node agents
    (orchestrator.slurm.following.node_agents), as the follower's last before the attempt
    closes: the supervisor's pass, each frame to the agents first. How many frames came."""
    came = sup.step(None, lambda s, event: agents.hand_on(s, event, judge, running), drain=True)
    agents.redial(sup, running)
    return came
