"""A new controller for a SLURM run whose own is gone (orchestrator.slurm.attach): in this
process, with a console (`orchestrator attach RUN`), or in the background (`attach RUN
--detach`, and the API's `attach`)."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from orchestrator.errors import error_from_report
from orchestrator.slurm.attach import attach_detached, attach_slurm


def take_over(run_id: str, run_dir: str | Path, out: BinaryIO, color: str = "auto") -> int:
    """Follow the run from this process to its end, on `out`; the run's exit code."""
    return attach_slurm(str(run_dir), run_id, out, color)


def take_over_detached(run_id: str, run_dir: str | Path) -> int:
    """Follow the run from a controller in the background; the job id it follows.
    OrchestratorError where it could not take over."""
    report = attach_detached(str(run_dir), run_id)
    if "error" in report:
        raise error_from_report(report)
    return int(report["job_id"])
