"""`orchestrator attach RUN`: a new controller for a SLURM run whose controller is gone.

The job is SLURM's, so it outlives the controller that submitted it (a login node that
rebooted, a killed terminal, kill -9). The new controller reads what the old one left
(orchestrator.slurm.following.handover): the job, how it was watched, where every source had been
read to. It cuts the logs back to that point, reaches the node agents again from their
offsets, and follows the job to its end exactly as the launch would have: console, hang
checks, `stacks`, resubmissions after a node failure or a time limit, the final status.

One controller at a time: each holds `follower.lock` in the record for as long as it
follows (an advisory lock, released by the kernel however the process ends), and attach
refuses a run whose lock is held. Over SSH there is nothing to attach to: a node whose
controller is gone stops its part by itself (--heartbeat-timeout).
"""

from __future__ import annotations

import os
import sys
from typing import BinaryIO

from orchestrator.console.sink import use_color
from orchestrator.errors import ConfigError
from orchestrator.options.backend_facts import facts_of
from orchestrator.record.runs import RunRecord, controller_alive, controller_log, this_controller
from orchestrator.record.states import RunState
from orchestrator.slurm.control.client import SlurmCommands
from orchestrator.slurm.following.follow import Follower
from orchestrator.slurm.following.handover import cut_logs, hold_lock, load
from orchestrator.slurm.recovery.spares import SlurmSpares
from orchestrator.slurm.submit import resubmitter
from orchestrator.start.detach import run_detached


def check_attachable(record: RunRecord) -> dict:
    """The run's status.json, where a new controller may take the run over; else
    ConfigError saying why not and what to do."""
    status = record.read_status()
    run_id = record.run_id
    if not facts_of(status.get("backend")).scheduled:
        raise ConfigError(
            f"run {run_id} ran over SSH: its nodes stop their part when its controller is "
            f"gone, so there is nothing to attach to; `orchestrator status {run_id}` says how "
            "it ended"
        )
    state = status.get("state")
    if state in {s.value for s in RunState if s.is_final}:
        raise ConfigError(
            f"run {run_id} has ended ({state}); `orchestrator status {run_id}` and "
            f"`orchestrator logs {run_id}` show how"
        )
    if controller_alive(status):
        controller = status.get("controller") or {}
        raise ConfigError(
            f"run {run_id} is followed by its controller (pid {controller.get('pid')} on "
            f"{controller.get('host')}); `orchestrator logs {run_id} -f` shows it, "
            f"`orchestrator stop {run_id}` stops it"
        )
    return status


def attach_slurm(
    run_dir: str, run_id: str, console: BinaryIO | None, color: str = "auto", report=None
) -> int:
    """Follow the SLURM run `run_id` of `run_dir` from this process to its end (the run's
    exit code), on `console` if one is given; `report` (a detached controller's) hears once
    the follower has taken over."""
    record = RunRecord.open(run_dir, run_id)
    check_attachable(record)
    lock = hold_lock(record)
    try:
        handover = load(record)
        job, following = handover.job, handover.following
        secrets = {name: os.environ[name] for name in job.secret_names if name in os.environ}
        missing = [name for name in job.secret_names if name not in secrets]
        if missing and (job.spares or job.min_nodes or job.max_resubmits):
            raise ConfigError(
                f"the run's next job (after a node failure or its time limit) needs the "
                f"secret(s) {', '.join(missing)}, which the run record never keeps: set them "
                "in this environment as for the launch, then attach again"
            )
        cut_logs(record.logs_dir, handover.points)
        commands = SlurmCommands(following.login, following.ssh)
        gone = handover.base.get("controller") or {}
        base = {**handover.base, "controller": this_controller()}
        resubmit = resubmitter(record, commands, following.command, secrets)
        spares = None
        if job.spares or job.min_nodes or handover.spares:
            spares = SlurmSpares(job, commands, following.bad_nodes, resubmit)
            handover.restore_spares(spares)
        follower = Follower(
            job,
            record,
            commands,
            handover.job_id,
            base,
            console,
            use_color(sys.stdout, color) if console is not None else False,
            spares,
            fold=following.fold,
            footer=following.footer,
            supervision=following.supervision,
            submit=resubmit,
            following=following,
            points=handover.points,
            handover=handover,
        )
        try:
            follower.note(
                f"run {run_id}: attached to SLURM job {handover.job_id} (its controller, pid "
                f"{gone.get('pid')} on {gone.get('host')}, is gone); every node's output "
                "goes on from where it had been read"
            )
            if report is not None:
                report({"started": True, "job_id": handover.job_id})
            return follower.run()
        finally:
            commands.close()
    finally:
        os.close(lock)


def attach_detached(run_dir: str, run_id: str) -> dict:
    """attach_slurm in a controller of its own (start/detach.py); its report once it has
    taken over, or why not."""
    record = RunRecord.open(run_dir, run_id)
    check_attachable(record)  # said here, at once, rather than in the controller's log
    log_path = controller_log(run_dir, run_id)
    return run_detached(f"{__name__}:attach_slurm", (run_dir, run_id, None, "never"), log_path)
