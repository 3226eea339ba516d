"""A launch's settings beyond the job spec: the run's name and command line, and the option
groups its stages use (the run's record and preflight, supervision, the console, SSH, the
hosts chosen), with the deadline made of --time over SSH. One frozen value; and the
`LaunchRequest` every backend takes (start/launch_backend.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.hosts.hostfile import Cluster
from orchestrator.options.choosing import Selection
from orchestrator.options.display import ConsoleOptions
from orchestrator.options.reaching import SshOptions
from orchestrator.options.running import RunOptions
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.options.supervision import Supervision
from orchestrator.plan.deadline import Deadline
from orchestrator.plan.spec import JobSpec


@dataclass(frozen=True)
class LaunchOptions:
    run_id: str
    argv: tuple[str, ...]  # the orchestrator command line, for script headers
    run: RunOptions = field(default_factory=RunOptions)
    supervision: Supervision = field(default_factory=Supervision)
    console: ConsoleOptions = field(default_factory=ConsoleOptions)
    ssh: SshOptions | None = None
    deadline: Deadline = Deadline()  # --time/--signal over SSH (under SLURM: SlurmOptions)
    # which hosts (a hostfile edited mid-run is read with the same choice), --bad-nodes
    # (where node faults write the hosts out), --min-nodes (a fault with no spare shrinks)
    hosts: Selection = field(default_factory=Selection)


@dataclass(frozen=True)
class LaunchRequest:
    """A launch, checked and ready to start (api/request.py's `build` makes it): what its
    backend needs, whoever asked."""

    backend: str  # the registry's name (api/registry.py): local, ssh or slurm
    cluster: Cluster | None  # None: SLURM without a hostfile
    spec: JobSpec
    options: LaunchOptions
    slurm: SlurmOptions
    spares: int = 0
    exclude: tuple[str, ...] = ()  # SLURM: hosts held back from the allocation
