"""`launch --backend slurm` and `render --backend slurm`: plan and render job.sbatch, write
it into the run record, submit it (here, or on a login node over SSH), then follow the job
(orchestrator.slurm.following.follow) in the foreground or, with --detach, in the background.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from orchestrator.console.sink import use_color
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.hosts.hostfile import Cluster
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.plan.scripts import command_line, make_output_dir, plan_yaml
from orchestrator.plan.spec import JobSpec
from orchestrator.record.runs import RunRecord, controller_log, ended_status, new_status
from orchestrator.record.states import RunState
from orchestrator.slurm.batch.batch_script import SCRIPT_NAME, render_sbatch
from orchestrator.slurm.batch.job import SlurmJob
from orchestrator.slurm.batch.node_files import NODE_FOLDER, in_record, kept_where, on_the_nodes
from orchestrator.slurm.batch.planning import plan_slurm_job
from orchestrator.slurm.control import client as slurm
from orchestrator.slurm.control.client import SlurmCommands
from orchestrator.slurm.following.follow import Follower
from orchestrator.slurm.following.handover import Following, hold_lock
from orchestrator.slurm.recovery.spares import SlurmSpares, check_capacity
from orchestrator.start.detach import run_detached
from orchestrator.start.settings import LaunchRequest


class Cancelled(OrchestratorError):
    """Ctrl-C before the follower took it over: the job was cancelled (exit code 130)."""

    exit_code = 130


def prepare_slurm(
    cluster: Cluster | None,
    spec: JobSpec,
    slurm_options: SlurmOptions,
    run_id: str,
    argv: tuple[str, ...],
    record_path: Path | None = None,
    spares: int = 0,
    exclude: tuple[str, ...] = (),
    min_nodes: int | None = None,
) -> tuple[SlurmJob, str]:
    """Plan and render; with a run record, nodes write their files into it, or with
    --job-dir into that folder on the nodes (node_files.py)."""
    job_dir, output = in_record(record_path) if record_path else (None, None)
    job = plan_slurm_job(
        spec,
        slurm_options,
        run_id,
        cluster,
        job_dir=job_dir,
        output=output,
        spares=spares,
        exclude=exclude,
        min_nodes=min_nodes,
    )
    if record_path and slurm_options.job_dir:
        job = on_the_nodes(job, slurm_options.job_dir)
    return job, render_sbatch(job, command_line(argv, job.secret_names))


def write_slurm_render(request: LaunchRequest, out_dir: str) -> list[Path]:
    """`render --backend slurm`: DIR/plan.yaml and DIR/job.sbatch (for sbatch by hand)."""
    slurm_options = request.slurm
    if slurm_options.login or slurm_options.job_dir:
        flag = "--login" if slurm_options.login else "--job-dir"
        raise ConfigError(f"{flag} applies to launch only")
    job, script = prepare_request(request, None)
    out = make_output_dir(out_dir)
    (out / "plan.yaml").write_text(plan_yaml(job), encoding="utf-8")
    (out / SCRIPT_NAME).write_text(script, encoding="utf-8")
    (out / SCRIPT_NAME).chmod(0o755)
    return [out / "plan.yaml", out / SCRIPT_NAME]


def launch_slurm(
    request: LaunchRequest, *, dry_run: bool = False, out: BinaryIO | None = None
) -> int:
    """Submit the job and follow it to its end from this process; the exit code."""
    out = out or sys.stdout.buffer
    job, script, record_path = prepared(request)
    if dry_run:
        given = "< " if job.node_side else ""  # on stdin: the login node may not see it
        out.write(
            f"# plan.yaml\n{plan_yaml(job)}# ---- {record_path / SCRIPT_NAME} "
            f"(submitted with: sbatch --parsable {given}{record_path / SCRIPT_NAME}) ----\n"
            f"{script}".encode()
        )
        out.flush()
        return 0
    return _submit_and_follow(job, script, request, out, None)


def start_slurm_detached(request: LaunchRequest) -> dict:
    """Submit the job with a controller of its own to follow it (start/detach.py); its
    report once the job is submitted: {"started": True, "job_id": ...} or {"error": ...,
    "exit_code": n}."""
    job, script, _ = prepared(request)
    options = request.options
    log_path = controller_log(options.run.run_dir, options.run_id)
    work = (job, script, request, None)
    return run_detached(f"{__name__}:_submit_and_follow", work, log_path)


def prepared(request: LaunchRequest) -> tuple[SlurmJob, str, Path]:
    """The job and its script, the script checked first where it is this machine's to see;
    and where the run's record goes."""
    spec, options = request.spec, request.options
    program = spec.program
    if not request.slurm.login and not program.is_module:
        path = os.path.join(spec.workdir, program.target)
        if not os.path.isfile(path):
            raise ConfigError(
                f"script {program.target!r} not found (looked in {spec.workdir}); "
                "give its path relative to --workdir or an absolute path"
            )
    record_path = Path(options.run.run_dir).resolve() / options.run_id
    job, script = prepare_request(request, record_path)
    return job, script, record_path


def prepare_request(request: LaunchRequest, record_path: Path | None) -> tuple[SlurmJob, str]:
    """`prepare_slurm` of a launch's request: its run's name, command line and hosts."""
    options = request.options
    return prepare_slurm(
        request.cluster,
        request.spec,
        request.slurm,
        options.run_id,
        options.argv,
        record_path,
        request.spares,
        request.exclude,
        options.hosts.min_nodes,
    )


def resubmitter(
    record: RunRecord, commands: SlurmCommands, command: str, secrets: dict[str, str]
) -> Callable[[SlurmJob, int], int]:
    """What submits the run's job number N (after a node failure, a time limit or a
    preemption): its script beside the first, job-<N>.sbatch, headed by `command`."""

    def resubmit(new_job: SlurmJob, number: int) -> int:
        path = record.path / f"job-{number}.sbatch"
        path.write_text(render_sbatch(new_job, command), encoding="utf-8")
        return slurm.submit(commands, str(path), secrets, on_stdin=new_job.node_side)

    return resubmit


def write_script(record: RunRecord, job: SlurmJob, script: str) -> None:
    """job.sbatch and plan.yaml in the run record."""
    (record.path / SCRIPT_NAME).write_text(script, encoding="utf-8")
    (record.path / "plan.yaml").write_text(plan_yaml(job), encoding="utf-8")


def _submit_and_follow(
    job: SlurmJob, script: str, request: LaunchRequest, console: BinaryIO | None, report
) -> int:
    spec, slurm_options, options = request.spec, request.slurm, request.options
    record = RunRecord.create(Path(options.run.run_dir).resolve(), options.run_id)
    lock = hold_lock(record)  # for as long as this process follows the run (attach.py)
    script_path = record.path / SCRIPT_NAME
    write_script(record, job, script)
    base = new_status(
        job.run_id,
        "slurm",
        command_line(options.argv, job.secret_names),
        job.program.describe(),
        job.nnodes,
        job.world_size,
        f"{job.master_addr or '(first node)'}:{job.master_port or '(from job id)'}",
    )
    base.update(
        script=str(script_path),
        slurm_job_id=None,
        slurm_state=None,
        slurm_login=slurm_options.login,
        attempt=1,
        slurm_restarts=0,
    )
    record.write_status(base)
    commands = None
    try:
        commands = SlurmCommands(slurm_options.login, options.ssh)
        if slurm_options.login and not job.node_side:
            rc, _, _ = commands.run(["test", "-d", str(record.path)])
            if rc != 0:  # nor, then, the nodes: they keep their files themselves
                job = on_the_nodes(job, NODE_FOLDER)
                command = command_line(options.argv, job.secret_names)
                write_script(record, job, render_sbatch(job, command))
        if job.node_side:
            base["node_files"] = job.job_dir  # on the nodes, each its own (node_files.py)
        secrets = {k: v for k, v in spec.env if k in job.secret_names}
        check_capacity(commands, job, slurm_options.partition)
        job_id = slurm.submit(commands, str(script_path), secrets, on_stdin=job.node_side)
    except OrchestratorError as exc:
        record.write_status(
            {
                **base,
                **ended_status(RunState.FAILED, exc.exit_code, str(exc)),
            }
        )
        if commands is not None:
            commands.close()
        os.close(lock)
        raise
    base["slurm_job_id"] = job_id
    record.write_status({**base, "state": RunState.QUEUED})
    color = use_color(sys.stdout, options.console.color) if console is not None else False
    following = Following(
        command_line(options.argv, job.secret_names),
        slurm_options.login,
        options.ssh,
        options.supervision,
        options.console.fold,
        options.console.footer,
        options.hosts.bad_nodes,
    )
    resubmit = resubmitter(record, commands, following.command, secrets)
    spares = None
    if job.spares or job.min_nodes:
        spares = SlurmSpares(job, commands, options.hosts.bad_nodes, resubmit)
        base.update(spares.status())
    follower = Follower(
        job,
        record,
        commands,
        job_id,
        base,
        console,
        color,
        spares,
        fold=options.console.fold,
        footer=options.console.footer,
        supervision=options.supervision,
        submit=resubmit,
        following=following,
    )
    follower.write_status()  # and what another controller would need (attach.py)
    try:
        follower.note(f"run {job.run_id}: SLURM job {job_id} submitted ({script_path})")
        if job.node_side:
            follower.note(kept_where(job, job_id))
        if report is not None:
            report({"started": True, "job_id": job_id})
        return follower.run()
    except KeyboardInterrupt:  # before the follower took over Ctrl-C
        slurm.cancel(commands, job_id)
        raise Cancelled(f"interrupted: cancelled SLURM job {job_id}") from None
    finally:
        commands.close()
        os.close(lock)
