"""What supervision knows about each node and rank, and how a run ended."""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.record.goodput.kept import close as close_goodput
from orchestrator.record.goodput.words import goodput_line
from orchestrator.record.runs import now_iso
from orchestrator.record.states import NodePhase, RankPhase, RunState
from orchestrator.supervise.clocks import NodeClock


@dataclass
class RankState:
    rank: int
    node: int
    local_rank: int
    host: str
    state: RankPhase = RankPhase.STARTING
    exit_code: int | None = None
    ended_at: float | None = None  # the controller's wall clock (node times are put into it)
    error_file: str = ""


@dataclass
class NodeState:
    index: int
    host: str
    ranks: tuple[int, ...] = ()
    state: NodePhase = NodePhase.STARTING
    exit_code: int | None = None
    pid: int | None = None
    started_at: float | None = None  # the controller's wall clock, as every time here
    ended_at: float | None = None
    detail: str = ""
    done: bool = False
    clock: NodeClock = field(default_factory=NodeClock)
    heard_wall: float = field(default_factory=time.time)  # when its agent last said anything
    failed_first: bool = False  # its failure or loss came before any stop: a cause
    lost_gone: bool = False  # lost, and its sshd did not answer either: the node or link died
    disk: str = ""  # its run directory cannot be written: "no space left on device in ~/..."
    disk_at: float | None = None  # when its agent found that, before any stop (else None)
    addresses: tuple[str, ...] = ()  # its IPv4 addresses, as its agent said with S

    def heard(self, at: float) -> None:
        """Its agent said something at `at` (the wall clock), unless it was heard later."""
        self.heard_wall = max(self.heard_wall, at)


@dataclass(frozen=True)
class NodeFault:
    """The node to blame when a run ended by the node's doing, not the job's: it was lost,
    its disk failed, or something outside the job killed a process there (SIGKILL,
    SIGBUS). A spare may replace it (orchestrator.start.pool)."""

    index: int  # its node rank
    host: str
    why: str  # "lost: its agent ended without reporting", "no space left on device in ..."
    noticed_at: float  # the controller's clock: when the run began to stop for it
    slow: bool = False  # not a fault of its own: a straggler taken out (straggler_swap.py)


@dataclass
class Outcome:
    state: RunState  # final: succeeded, failed, stopped, lost, hung, unreachable
    exit_code: int
    summary: str = ""
    node_fault: NodeFault | None = None  # set only when the first fault was a node's

    def closing_lines(self, run_id: str, elapsed: float, logs_dir: object) -> list[str]:
        """What the console says last: the summary (on success, the restarts it took),
        how the run ended, then where its wall time went (its goodput, computed now from
        the record that holds `logs_dir` and kept in its status.json)."""
        lines = [self.summary] if self.summary or self.state != RunState.SUCCEEDED else []
        if self.state == RunState.SUCCEEDED:
            lines.append(f"run {run_id} succeeded in {elapsed:.1f} s")
        else:
            lines.append(
                f"run {run_id} {self.state} (exit code {self.exit_code}) after "
                f"{elapsed:.1f} s; logs in {logs_dir}"
            )
        goodput = close_goodput(Path(str(logs_dir)).parent)
        return [*lines, goodput_line(goodput)] if goodput is not None else lines


def disk_error(name: str) -> str:
    """An errno name from a node (ENOSPC) in words: "no space left on device"."""
    code = getattr(errno, name, None)
    return os.strerror(code).lower() if isinstance(code, int) else name


KILLED_FROM_OUTSIDE = (signal.SIGKILL, signal.SIGBUS)  # the OOM killer, a dying node, bad memory


def killed_from_outside(code: int | None) -> bool:
    """An exit code that says SIGKILL or SIGBUS: the job does not send these to itself."""
    return code is not None and any(code in (-sig, 128 + sig) for sig in KILLED_FROM_OUTSIDE)


def terminated(code: int | None) -> bool:
    """An exit code that says SIGTERM: how torchrun ends a node's other workers."""
    return code in (-signal.SIGTERM, 128 + signal.SIGTERM)


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


@dataclass(frozen=True)
class States:
    """Every node's and rank's state as supervision starts it, and their console labels."""

    nodes: list[NodeState]
    ranks: list[RankState]
    node_labels: dict[int, str]  # node rank -> host
    rank_labels: dict[int, str]  # rank -> "host rN"


def states_of(placed: Iterable[tuple[str, Sequence[int]]]) -> States:
    """The first state of every node (a host and its ranks, in node-rank order) and of its
    ranks, with their labels: the same over SSH (the plan's nodes) and under SLURM (node K's
    ranks K * nproc on)."""
    states = States([], [], {}, {})
    for k, (host, node_ranks) in enumerate(placed):
        states.node_labels[k] = host
        states.nodes.append(NodeState(index=k, host=host, ranks=tuple(node_ranks)))
        for local, rank in enumerate(node_ranks):
            states.rank_labels[rank] = f"{host} r{rank}"
            states.ranks.append(RankState(rank, k, local, host))
    return states


def nodes_and_ranks(nodes: Iterable[NodeState], ranks: Iterable[RankState]) -> dict:
    """status.json's `nodes` and `ranks`: every node's and rank's state, as the run goes."""

    def when(t: float | None) -> str | None:
        return now_iso(t) if t is not None else None

    return {
        "nodes": [
            {
                "node_rank": n.index,
                "host": n.host,
                "state": n.state,
                "exit_code": n.exit_code,
                "pid": n.pid,
                "started_at": when(n.started_at),
                "ended_at": when(n.ended_at),
                "detail": n.detail or None,
            }
            for n in nodes
        ],
        "ranks": [
            {
                "rank": r.rank,
                "node_rank": r.node,
                "local_rank": r.local_rank,
                "host": r.host,
                "state": r.state,
                "exit_code": r.exit_code,
                "ended_at": when(r.ended_at),
            }
            for r in sorted(ranks, key=lambda r: r.rank)
        ],
    }
