"""A launch's settings beyond the job spec: where the run is recorded, how failures are
timed and judged, how the console looks, how nodes are reached. One frozen value."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.backends.base import SshOptions
from orchestrator.nodes.probe import MIN_FREE_DISK
from orchestrator.plan.deadline import Deadline
from orchestrator.supervise.hangs import DEFAULT_HANG_TIMEOUT_S
from orchestrator.supervise.stragglers import RATIO, WINDOW_S


@dataclass(frozen=True)
class LaunchOptions:
    run_dir: str
    run_id: str
    argv: tuple[str, ...]  # the orchestrator command line, for script headers
    grace: float = 10.0
    heartbeat_timeout: float = 30.0
    stall_timeout: float = 600.0
    hang_timeout: float = DEFAULT_HANG_TIMEOUT_S  # 0: no hang checks (supervise/hangs.py)
    min_free_disk: int = MIN_FREE_DISK
    keep_node_logs: bool = False
    bad_nodes: str | None = None  # --bad-nodes FILE: where node faults write the hosts out
    color: str = "auto"
    fold: bool = True  # --no-fold: the console shows every line as printed
    footer: bool = True  # --no-footer: no summary line under the stream on a terminal
    stragglers: tuple[float, float] = (RATIO, WINDOW_S)  # --stragglers RATIO,SECONDS
    preflight: bool = True
    ssh: SshOptions | None = None
    deadline: Deadline = Deadline()  # --time/--signal over SSH (under SLURM: SlurmOptions)
