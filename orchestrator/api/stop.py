"""Acting on a run from another shell: `orchestrator stop RUN`.

A run is stopped through its controller (found by pid and start time in status.json, so a
recycled pid is never signalled): SIGTERM makes it stop every node in order, exactly as
Ctrl-C does; a second stop skips the grace period.
"""

from __future__ import annotations

import os
import signal
import time

from orchestrator.errors import OrchestratorError
from orchestrator.record.runs import RunRecord


def stop_run(record: RunRecord, wait_s: float, say=print) -> int:
    """Ask the run's controller to stop it everywhere and wait for the end; exit code."""
    current = record.run_status()
    status = dict(current.document)
    if current.ended_in_record:
        say(f"run {record.run_id} already ended: {current.recorded_state}")
        return 0
    if current.backend == "slurm":
        from orchestrator.slurm.client import cancel_run

        return cancel_run(record, status, say)
    if not current.controller_alive:  # lost: said as what it means here
        say(
            f"run {record.run_id}: its controller (pid {status['controller']['pid']}) is gone; "
            "its nodes stop their part by themselves once they lose contact with it"
        )
        return 1
    pid = status["controller"]["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise OrchestratorError(f"run {record.run_id}: controller pid {pid} vanished") from None
    say(f"run {record.run_id}: asked controller (pid {pid}) to stop it on every node")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        current = record.run_status()
        if current.ended_in_record:
            say(f"run {record.run_id}: {current.recorded_state}")
            return 0
        if not current.controller_alive:
            say(f"run {record.run_id}: controller ended")
            return 0
        time.sleep(0.2)
    say(
        f"run {record.run_id}: still stopping after {wait_s:g} s; run `orchestrator stop "
        f"{record.run_id}` again to kill it at once"
    )
    return 1
