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
from orchestrator.record.runs import FINAL_STATES, RunRecord, controller_alive


def stop_run(record: RunRecord, wait_s: float, say=print) -> int:
    """Ask the run's controller to stop it everywhere and wait for the end; exit code."""
    status = record.read_status()
    state = status.get("state")
    if state in FINAL_STATES:
        say(f"run {record.run_id} already ended: {state}")
        return 0
    if status.get("backend") == "slurm":
        from orchestrator.slurm.client import cancel_run

        return cancel_run(record, status, say)
    if not controller_alive(status):
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
        status = record.read_status()
        if status.get("state") in FINAL_STATES:
            say(f"run {record.run_id}: {status['state']}")
            return 0
        if not controller_alive(status):
            say(f"run {record.run_id}: controller ended")
            return 0
        time.sleep(0.2)
    say(
        f"run {record.run_id}: still stopping after {wait_s:g} s; run `orchestrator stop "
        f"{record.run_id}` again to kill it at once"
    )
    return 1
