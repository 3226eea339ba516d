"""What a launch backend is: one small class per way a run is started and followed (local and
ssh in start/ssh_backend.py, slurm in slurm/backend.py), looked up by name in api/registry.py.

The way torchx's Runner finds a `Scheduler` by name: the API builds one `LaunchRequest`
(start/settings.py) whatever the backend, then makes one call on the backend it names. What
the stages below the API need to know of a backend without starting it (the container
runtimes it runs, whether a scheduler follows its runs, ...) is its `facts`, plain data in
options/backend_facts.py. docs/architecture.md says what a new backend writes.

`poll` is typed loosely for now: a run's status as its record and its scheduler say (SLURM:
squeue's and sacct's word on the job, the nodes' states over SSH), not yet one typed
scheduler state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, ClassVar

from orchestrator.options.backend_facts import BackendFacts
from orchestrator.record.runs import RunRecord
from orchestrator.record.states import RunStatus
from orchestrator.start.settings import LaunchRequest

Say = Callable[[str], None]


class Backend(ABC):
    """How a run is prepared, started, polled and stopped on one kind of machines."""

    facts: ClassVar[BackendFacts]  # options/backend_facts.py: its name and what it allows

    @property
    def name(self) -> str:
        return self.facts.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    @abstractmethod
    def render(self, request: LaunchRequest, out_dir: str) -> list[Path]:
        """Prepare: the plan and the scripts that would run, written into `out_dir`,
        touching no node (`render`); the files written."""

    @abstractmethod
    def launch(self, request: LaunchRequest, *, dry_run: bool, out: BinaryIO) -> int:
        """Start the run's attempts and follow them to the end from this process, its
        console on `out`; the exit code. `dry_run`: print the prepared plan and scripts
        (exactly what would run) and stop there."""

    @abstractmethod
    def start_detached(self, request: LaunchRequest) -> dict:
        """Start the run with a controller of its own (start/detach.py); its report once
        started: {"started": True, ...} or {"error": ..., "exit_code": n}."""

    @abstractmethod
    def poll(self, record: RunRecord, current: RunStatus) -> RunStatus:
        """The run's status now: `current` (its record as read) with what the backend
        itself knows of its attempt added."""

    @abstractmethod
    def stop(self, record: RunRecord, current: RunStatus, wait_s: float, say: Say) -> int:
        """Cancel: stop a run not yet ended in its record, from another shell, waiting up
        to `wait_s` for its end where the backend waits; the exit code."""
