"""The commands that start work on the nodes: `launch` (a job), `render` (its scripts, run
nothing) and `exec` (a shell command everywhere)."""

from __future__ import annotations

import sys

import click

from orchestrator.api.launching import exec_command as run_exec
from orchestrator.api.launching import (
    exec_on_run,
    results_table,
    start_attached,
    start_detached,
    started_error,
)
from orchestrator.api.launching import render as render_files
from orchestrator.api.request import build
from orchestrator.cli.context import CONTEXT
from orchestrator.cli.flags import note, options_of
from orchestrator.cli.hostfile_argument import HostfileOptional, split_hostfile
from orchestrator.errors import ConfigError
from orchestrator.options.choosing import Selection
from orchestrator.options.declare import keywords_of
from orchestrator.options.display import ConsoleOptions
from orchestrator.options.image import ContainerOptions
from orchestrator.options.keywords import LaunchArgs
from orchestrator.options.reaching import SshOptions
from orchestrator.options.running import RunOptions
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.options.supervision import TASK_GRACE_S, Supervision
from orchestrator.options.workload import JobOptions

# The SLURM request's flags but --login and --job-dir, which only `launch` takes (render
# submits nothing, and its script keeps no run record).
SLURM_REQUEST = [name for name in keywords_of(SlurmOptions) if name not in ("login", "job_dir")]


@click.command(cls=HostfileOptional, context_settings=CONTEXT)
@click.argument("hostfile", type=click.Path(), required=False)
@click.argument("program", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT ARGS...]")
@options_of(JobOptions)
@options_of(ContainerOptions)
@options_of(Selection)
@options_of(RunOptions)
@options_of(SlurmOptions)
@options_of(SshOptions)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Probe the nodes, then print the plan and every node script; start nothing.",
)
@click.option(
    "--detach",
    is_flag=True,
    help="Return once the job runs on every node; a background controller "
    "supervises it. Use `logs RUN -f`, `status RUN` and `stop RUN` later.",
)
@options_of(Supervision)
@options_of(ConsoleOptions)
def launch(hostfile, program, dry_run, detach, **keywords):
    """Run a job on every node of HOSTFILE.

    Without a script, runs the bundled DDP trainer (python -m orchestrator.trainer).
    Give your own after `--`: `orchestrator launch hosts.txt -- train.py --lr 0.1`
    (or `-- -m package.module ...`). Exit status: 0 when every rank succeeded, else the
    first failing rank's exit code (130 after Ctrl-C, 2 for bad input).

    With --backend slurm, one sbatch job runs it (`launch --backend slurm --nodes 2
    --partition gpu -- train.py`): the job id is printed, then its state and the ranks'
    output; Ctrl-C cancels the job.
    """
    hostfile, program = split_hostfile(hostfile, program)
    argv = ("orchestrator", *sys.argv[1:])
    args = LaunchArgs.of(keywords)
    request = build(hostfile, program, args, argv, note, new_run=not dry_run)
    if not detach or dry_run:
        return start_attached(request, dry_run, sys.stdout.buffer)
    report = start_detached(request)
    if "error" in report:
        raise started_error(report)
    run, where = request.options.run_id, args.run.run_dir
    if "job_id" in report:
        click.echo(f"run {run}: SLURM job {report['job_id']} submitted")
    else:
        click.echo(f"run {run} started in the background")
    click.echo(f"  follow it:  orchestrator logs {run} -f --run-dir {where}")
    click.echo(f"  state:      orchestrator status {run} --run-dir {where}")
    verb = "cancel it" if "job_id" in report else "stop it  "
    click.echo(f"  {verb}:  orchestrator stop {run} --run-dir {where}")
    return 0


@click.command(cls=HostfileOptional, context_settings=CONTEXT)
@click.argument("hostfile", type=click.Path(), required=False)
@click.argument("program", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT ARGS...]")
@click.option(
    "-o",
    "--output",
    "out_dir",
    required=True,
    metavar="DIR",
    help="Folder to write plan.yaml and node0.sh, node1.sh, ... (or job.sbatch) into.",
)
@options_of(RunOptions, ["run_id"], helps={"run_id": "Run id written into the scripts."})
@options_of(JobOptions)
@options_of(ContainerOptions)
@options_of(Selection)
@options_of(RunOptions, ["backend"])
@options_of(SlurmOptions, SLURM_REQUEST)
def render(hostfile, program, out_dir, **keywords):
    """Write the plan and one torchrun script per node, without touching any node.

    Each script runs by hand on its node: `bash DIR/node0.sh` on the first node, and so on.
    Interfaces are picked by the scripts when they start (no probe here); MASTER_PORT is
    29500 unless given. With --backend slurm: DIR/job.sbatch, to submit with
    `sbatch DIR/job.sbatch` (the ranks' output then goes to slurm-<jobid>.out).
    """
    hostfile, program = split_hostfile(hostfile, program)
    argv = ("orchestrator", *sys.argv[1:])
    for path in render_files(hostfile, program, out_dir=out_dir, say=note, argv=argv, **keywords):
        click.echo(str(path))
    return 0


EXEC_PYTHON = (
    "Interpreter that runs the small node agent on every node (standard library only). "
    "Default: this orchestrator's interpreter path; a hostfile python wins."
)
EXEC_GRACE = "On Ctrl-C, time between SIGTERM and SIGKILL."


@click.command("exec", cls=HostfileOptional, context_settings=CONTEXT)
@click.argument("hostfile", type=click.Path(), required=False)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND...")
@click.option(
    "--run",
    "run_id",
    metavar="RUN",
    help="Instead of a HOSTFILE: every node of this running SLURM run's job, the command "
    "run there as a step of the job (srun, from this machine).",
)
@options_of(RunOptions, ["run_dir"], helps={"run_dir": "Where --run's record is kept."})
@options_of(SshOptions)
@options_of(JobOptions, ["python"], helps={"python": EXEC_PYTHON})
@options_of(Supervision, ["grace"], helps={"grace": EXEC_GRACE}, defaults={"grace": TASK_GRACE_S})
@click.option(
    "--timeout",
    type=float,  # its bound is exec_command's, checked there for the API alike
    default=None,
    metavar="SECONDS",
    help="Stop the command everywhere after this long.",
)
@options_of(ConsoleOptions, ["color", "fold"], helps={"color": "Colour the host prefixes."})
def exec_command(hostfile, command, run_id, run_dir, timeout, **keywords):
    """Run a shell command on every node of HOSTFILE (or of a SLURM run) at once.

    Output comes back attributed ([host] line); a table of exit codes ends it. The exit
    status is 0 when the command succeeded everywhere, 1 otherwise. Ctrl-C stops the
    command on every node. Example: orchestrator exec hosts.txt -- nvidia-smi -L

    With --run RUN instead of HOSTFILE: once on every node of that SLURM run's job while
    it runs (its node names from SLURM), as one step of the job (`srun --overlap`, sharing
    the job's CPUs and GPUs): orchestrator exec --run RUN -- nvidia-smi. Ctrl-C ends the
    step. A run submitted with --login is refused: run exec on that login node. An SSH
    run's nodes need the HOSTFILE it was launched with.
    """
    hostfile, command = split_hostfile(hostfile, command)
    given = exec_flags_given(("run_dir",) if run_id is None else (*SSH_FLAGS, "python"))
    exec_target_check(hostfile, run_id, command, given)
    out = sys.stdout.buffer
    line = " ".join(command)
    if run_id is None:
        results = run_exec(hostfile, line, timeout=timeout, console=out, **keywords)
    else:
        shown = {k: keywords[k] for k in ("grace", "color", "fold")}
        results = exec_on_run(run_id, line, run_dir=run_dir, timeout=timeout, console=out, **shown)
    out.write(results_table(results).encode())
    out.flush()
    return 0 if all(result.ok for result in results) else 1


SSH_FLAGS = keywords_of(SshOptions)


def exec_flags_given(names) -> list[str]:
    """The flags among `names` given on this command line (not left to their default)."""
    context = click.get_current_context()
    default = click.core.ParameterSource.DEFAULT
    params = {param.name: param for param in context.command.params}
    return [
        params[name].opts[0]
        for name in names
        if context.get_parameter_source(name) not in (None, default)
    ]


def exec_target_check(hostfile, run_id, command, given) -> None:
    """exec takes exactly one of HOSTFILE and --run, a COMMAND, and only their flags."""
    if hostfile is not None and run_id is not None:
        raise ConfigError(
            f"exec takes a HOSTFILE or --run RUN, not both (HOSTFILE {hostfile}, --run "
            f"{run_id}); put the command after `--`"
        )
    if hostfile is None and run_id is None:
        raise ConfigError(
            "exec needs the nodes: a HOSTFILE (`exec hosts.txt -- COMMAND`) or a running "
            "SLURM run (`exec --run RUN -- COMMAND`)"
        )
    if not command:
        raise ConfigError("exec: no COMMAND; give it after `--`: exec ... -- nvidia-smi -L")
    if given:
        used = "--run reaches the nodes with srun" if run_id else "a HOSTFILE names the nodes"
        raise ConfigError(f"exec: {', '.join(given)} cannot be used here: {used}")
