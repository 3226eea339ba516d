"""The slurm backend: one sbatch job whose tasks are the node agents (slurm/submit.py submits
it, slurm/following/follow.py follows it); SLURM, not the controller, keeps the job, so its runs are
asked of squeue and sacct once no controller follows them."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from orchestrator.options.backend_facts import SLURM
from orchestrator.record.runs import RunRecord, run_status
from orchestrator.record.states import RunStatus
from orchestrator.slurm.control.client import cancel_run, refresh_status
from orchestrator.slurm.submit import launch_slurm, start_slurm_detached, write_slurm_render
from orchestrator.start.launch_backend import Backend, Say
from orchestrator.start.settings import LaunchRequest


class SlurmBackend(Backend):
    """Under SLURM: sbatch, squeue/sacct, scancel; here or on a --login node."""

    facts = SLURM

    def render(self, request: LaunchRequest, out_dir: str) -> list[Path]:
        return write_slurm_render(request, out_dir)

    def launch(self, request: LaunchRequest, *, dry_run: bool, out: BinaryIO) -> int:
        return launch_slurm(request, dry_run=dry_run, out=out)

    def start_detached(self, request: LaunchRequest) -> dict:
        return start_slurm_detached(request)

    def poll(self, record: RunRecord, current: RunStatus) -> RunStatus:
        """A run not ended in its record, with squeue's or sacct's word on its job."""
        if current.ended_in_record:
            return current
        return run_status(refresh_status(record, dict(current.document)))

    def stop(self, record: RunRecord, current: RunStatus, wait_s: float, say: Say) -> int:
        """scancel, then the end as SLURM says it (slurm/control/client.py's own wait)."""
        return cancel_run(record, dict(current.document), say)
