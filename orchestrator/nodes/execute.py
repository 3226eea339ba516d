"""Run one command on many nodes at once through their agents: for `orchestrator exec`
and the preflight probe. Every node runs to its end; nothing is left behind on Ctrl-C."""

from __future__ import annotations

import queue
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from orchestrator.backends import close_all, connect_cluster
from orchestrator.backends.base import NodeConnection
from orchestrator.backends.sessions import Event, NodeSession, start_sessions
from orchestrator.console.progress import Progress
from orchestrator.console.sink import LogSink, use_color
from orchestrator.errors import Interrupted
from orchestrator.hosts.hostfile import Cluster
from orchestrator.options.display import ConsoleOptions
from orchestrator.options.supervision import NODE_TASKS, Supervision
from orchestrator.record.states import NodePhase
from orchestrator.supervise import NodeState, Supervisor, describe_exit, signals_to


@dataclass(frozen=True)
class NodeResult:
    host: str
    exit_code: int | None
    output: str
    state: NodePhase  # succeeded, failed, lost, stopped
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.state == NodePhase.SUCCEEDED

    def describe(self) -> str:
        if self.state == NodePhase.LOST:
            return f"lost: {self.detail}"
        if self.detail:
            return f"{self.detail} ({describe_exit(self.exit_code)})"
        return describe_exit(self.exit_code)


class CaptureSink:
    """A sink that keeps every node's output instead of printing it."""

    footer = None  # nothing is printed, so nothing stays under it

    def __init__(self) -> None:
        self.output: dict[int, list[bytes]] = {}
        self.notes: list[str] = []

    def node_output(self, node: int, data: bytes, console: bool = True) -> None:
        self.output.setdefault(node, []).append(data)  # all of it: it is the command's

    def rank_output(self, rank: int, data: bytes) -> None:  # no ranks in a command
        pass

    def note(self, text: str) -> None:
        self.notes.append(text)

    def node_note(self, host: str, text: str) -> None:
        self.notes.append(f"{host}: {text}")

    def last_lines(self, rank: int | None = None, node: int | None = None) -> list[str]:
        text = b"".join(self.output.get(node, [])).decode(errors="replace")
        return text.splitlines()[-20:]

    def flush(self, drain: bool = False) -> None:
        pass

    def end_footer(self) -> None:
        pass

    def holding(self) -> bool:
        return False


def run_on_nodes(
    connections: Sequence[NodeConnection],
    pythons: Sequence[str],
    argvs: Sequence[Sequence[str]],
    *,
    sink: LogSink | CaptureSink | None = None,
    supervision: Supervision = NODE_TASKS,
    time_limit: float | None = None,
    tag: str = "command",
    what: str = "the command",
    progress: Progress | None = None,
) -> list[NodeResult]:
    """Run argvs[i] on connections[i] with the interpreter pythons[i] running its agent.

    `tag` is the agents' ORCHESTRATOR_RUN_ID, so that their processes can be found; `what`
    names the step in the message when Ctrl-C interrupts it (raised as `Interrupted`).
    """
    capture = sink if sink is not None else CaptureSink()
    events: queue.Queue[Event] = queue.Queue()
    sessions: list[NodeSession] = []
    try:
        config = {
            "grace": supervision.grace,
            "heartbeat_timeout": supervision.heartbeat_timeout,
        }
        sessions = start_sessions(
            [
                (index, connection, python, tag, {**config, "argv": list(argv)})
                for index, (connection, python, argv) in enumerate(
                    zip(connections, pythons, argvs, strict=True)
                )
            ],
            events,
        )
        nodes = [NodeState(index=i, host=c.host) for i, c in enumerate(connections)]
        supervisor = Supervisor(
            nodes,
            [],
            sessions,
            events,
            capture,
            supervision,
            stop_on_failure=False,
            time_limit=time_limit,
            on_change=lambda sup: progress and progress.count(*nodes_done(sup.nodes)),
        )
        with signals_to(supervisor):
            supervisor.run()
    finally:
        for session in sessions:
            session.close()
    if supervisor.stopper.interrupted_by is not None:
        raise Interrupted(supervisor.stopper.interrupted_by, what)
    results = []
    for node in nodes:
        text = (
            b"".join(capture.output.get(node.index, [])).decode(errors="replace")
            if isinstance(capture, CaptureSink)
            else ""
        )
        detail = node.detail or ("time limit reached" if supervisor.timed_out else "")
        results.append(NodeResult(node.host, node.exit_code, text, node.state, detail))
    return results


def nodes_done(nodes: Sequence[NodeState]) -> tuple[int, int]:
    """How many nodes are done, and how many of those did not succeed."""
    done = [node for node in nodes if node.done]
    return len(done), sum(node.state != NodePhase.SUCCEEDED for node in done)


def run_command(
    cluster: Cluster,
    command: str,
    python: str,
    ssh_options: object,
    *,
    supervision: Supervision,
    time_limit: float | None,
    console: BinaryIO | None,
    shown: ConsoleOptions,
) -> list[NodeResult]:
    """`orchestrator exec`: the command on every node at once, its output attributed on
    `console` as it comes (None: kept in the results only); every node's result."""
    connections = connect_cluster(cluster, ssh_options)
    try:
        labels = {index: host.name for index, host in enumerate(cluster.hosts)}
        color = use_color(console, shown.color)
        sink = LogSink(None, {}, labels, console, color, fold=shown.fold)
        return run_on_nodes(
            connections,
            [h.python or python for h in cluster.hosts],
            [["bash", "-c", command]] * len(connections),
            sink=sink,
            supervision=supervision,
            time_limit=time_limit,
        )
    finally:
        close_all(connections)


def results_table(results: list[NodeResult]) -> str:
    """exec's closing table: each node's result, then how many succeeded."""
    width = max((len(result.host) for result in results), default=4)
    failed = [result for result in results if not result.ok]
    lines = [f"{'HOST'.ljust(width)}  RESULT"]
    lines += [f"{r.host.ljust(width)}  {'ok' if r.ok else r.describe()}" for r in results]
    lines.append(f"{len(results) - len(failed)} of {len(results)} node(s) succeeded")
    return "\n".join(lines) + "\n"


def last_line(result: NodeResult) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    return f": {lines[-1]}" if lines else ""
