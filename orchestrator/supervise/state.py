"""What supervision knows about each node and rank, and how a run ended."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

from orchestrator.supervise.clocks import NodeClock


@dataclass
class RankState:
    rank: int
    node: int
    local_rank: int
    host: str
    state: str = "starting"  # running, succeeded, failed, stopped, killed, unknown
    exit_code: int | None = None
    ended_at: float | None = None  # the controller's wall clock (node times are put into it)
    error_file: str = ""


@dataclass
class NodeState:
    index: int
    host: str
    ranks: tuple[int, ...] = ()
    state: str = "starting"  # running, succeeded, failed, stopped, lost
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


@dataclass
class Outcome:
    state: str  # succeeded, failed, stopped, lost
    exit_code: int
    summary: str = ""

    def closing_lines(self, run_id: str, elapsed: float, logs_dir: object) -> list[str]:
        """What the console says last: the summary (on success, the restarts it took),
        then how the run ended."""
        lines = [self.summary] if self.summary or self.state != "succeeded" else []
        if self.state == "succeeded":
            return [*lines, f"run {run_id} succeeded in {elapsed:.1f} s"]
        return [
            *lines,
            f"run {run_id} {self.state} (exit code {self.exit_code}) after "
            f"{elapsed:.1f} s; logs in {logs_dir}",
        ]


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
