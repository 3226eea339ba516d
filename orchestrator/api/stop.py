"""Acting on a run from another shell: `orchestrator stop RUN`.

A run is stopped by its backend (start/ssh_backend.py, slurm/backend.py): over SSH through
its controller (found by pid and start time in status.json, so a recycled pid is never
signalled): SIGTERM makes it stop every node in order, exactly as Ctrl-C does; a second
stop skips the grace period. Under SLURM its job is cancelled.
"""

from __future__ import annotations

from orchestrator.api.registry import recorded_backend
from orchestrator.record.runs import RunRecord


def stop_run(record: RunRecord, wait_s: float, say=print) -> int:
    """Stop the run everywhere through its backend and wait for the end; exit code."""
    current = record.run_status()
    if current.ended_in_record:
        say(f"run {record.run_id} already ended: {current.recorded_state}")
        return 0
    return recorded_backend(current.backend).stop(record, current, wait_s, say)
