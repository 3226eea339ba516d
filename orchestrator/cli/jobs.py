"""The commands that start work on the nodes: `launch` (a job), `render` (its scripts, run
nothing) and `exec` (a shell command everywhere)."""

from __future__ import annotations

import sys

import click

from orchestrator.api.keywords import LaunchArgs, build
from orchestrator.api.launching import (
    exec_command as run_exec,
)
from orchestrator.api.launching import (
    render as render_files,
)
from orchestrator.api.launching import (
    results_table,
    start_attached,
    start_detached,
    started_error,
)
from orchestrator.cli.backend_options import HostfileOptional, backend_options, split_hostfile
from orchestrator.cli.context import CONTEXT
from orchestrator.cli.options import (
    DEFAULTS,
    fold_option,
    footer_option,
    job_options,
    note,
    run_options,
    size_value,
    ssh_options,
    stragglers_option,
)
from orchestrator.cli.selecting import selection_options, spares_option


@click.command(cls=HostfileOptional, context_settings=CONTEXT)
@click.argument("hostfile", type=click.Path(), required=False)
@click.argument("program", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT ARGS...]")
@job_options
@selection_options
@spares_option
@backend_options
@click.option(
    "--login",
    metavar="HOST",
    help="[slurm] Run sbatch/squeue/scancel on this login node over SSH; --run-dir "
    "must then be on a file system the cluster shares (same path).",
)
@click.option(
    "--sync",
    "sync_dir",
    metavar="DIR",
    help="Copy DIR into every node's run directory (over SFTP) before starting; "
    "the ranks start in the copy. Default: the script is expected at the same "
    "path on every node (shared file system).",
)
@run_options
@ssh_options
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
@click.option(
    "--no-preflight",
    "preflight",
    flag_value=False,
    default=DEFAULTS.preflight,
    help="Skip probing the nodes (python, torch, interface, port) before starting.",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=DEFAULTS.grace,
    show_default=True,
    metavar="SECONDS",
    help="On a failure or Ctrl-C, how long ranks get between SIGTERM and SIGKILL.",
)
@click.option(
    "--heartbeat-timeout",
    type=click.FloatRange(min=0),
    default=DEFAULTS.heartbeat_timeout,
    show_default=True,
    metavar="SECONDS",
    help="A node whose agent is silent this long and whose sshd does not answer an SSH "
    "keepalive either is lost (the run stops); a node that hears nothing from the "
    "orchestrator this long, and whose connection's other end does not answer, stops its "
    "part by itself. 0: never.",
)
@click.option(
    "--stall-timeout",
    type=click.FloatRange(min=0),
    default=DEFAULTS.stall_timeout,
    show_default=True,
    metavar="SECONDS",
    help="A node whose agent is silent but whose sshd still answers is busy, not lost: "
    "it is waited for this long before it counts as lost (and an agent waits as long for "
    "a silent orchestrator whose host still answers).",
)
@click.option(
    "--hang-timeout",
    type=click.FloatRange(min=0),
    default=DEFAULTS.hang_timeout,
    show_default=True,
    metavar="SECONDS",
    help="When no rank has printed a line or written a metric this long, every rank's "
    "stack is taken twice, 5 s apart: if none moved, the run hangs: the console names the "
    "odd ranks out and where they wait, the stacks go to runs/RUN/stacks/ and torch's "
    "flight recorder dumps to runs/RUN/flight/ (its analyser names the collective the stuck "
    "ranks never joined), and the run ends `hung` (exit 1) before anything is killed, or, "
    "while --max-restarts has restarts left, the stuck ranks are ended so that torchrun "
    "restarts the workers. If any moved, it works silently and goes on. 0: never check.",
)
@click.option(
    "--min-free-disk",
    default=DEFAULTS.min_free_disk,
    show_default=True,
    metavar="SIZE",
    callback=lambda ctx, param, value: size_value(param, value),
    help="The preflight warns about a node with less free space than this (64M, 1G, ...) "
    "where it keeps the run's files (~/.orchestrator/runs): a rank whose output does not "
    "fit fails, and the run then names the node's full disk.",
)
@click.option(
    "--keep-node-logs",
    is_flag=True,
    help="Keep each node's copy of the run's output (~/.orchestrator/runs/RUN on the node) "
    "after a successful run. Without it, a node's copy is removed once the run succeeded "
    "and this machine holds all of it; copies of runs that failed or stopped are kept until "
    "`orchestrator clean` removes them.",
)
@click.option(
    "--color",
    type=click.Choice(["auto", "always", "never"]),
    default=DEFAULTS.color,
    show_default=True,
    help="Colour the rank prefixes.",
)
@fold_option
@footer_option
@stragglers_option
def launch(hostfile, program, dry_run, detach, **flags):
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
    request = build(hostfile, program, LaunchArgs.of(flags), argv, note, new_run=not dry_run)
    if not detach or dry_run:
        return start_attached(request, dry_run, sys.stdout.buffer)
    report = start_detached(request)
    if "error" in report:
        raise started_error(report)
    run, where = request.options.run_id, request.options.run_dir
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
@click.option("--run-id", metavar="NAME", help="Run id written into the scripts.")
@job_options
@selection_options
@spares_option
@backend_options
def render(hostfile, program, out_dir, run_id, backend, spares, **job):
    """Write the plan and one torchrun script per node, without touching any node.

    Each script runs by hand on its node: `bash DIR/node0.sh` on the first node, and so on.
    Interfaces are picked by the scripts when they start (no probe here); MASTER_PORT is
    29500 unless given. With --backend slurm: DIR/job.sbatch, to submit with
    `sbatch DIR/job.sbatch` (the ranks' output then goes to slurm-<jobid>.out).
    """
    hostfile, program = split_hostfile(hostfile, program)
    keywords = {**job, "run_id": run_id, "backend": backend, "spares": spares}
    argv = ("orchestrator", *sys.argv[1:])
    for path in render_files(hostfile, program, out_dir=out_dir, say=note, argv=argv, **keywords):
        click.echo(str(path))
    return 0


@click.command("exec", context_settings=CONTEXT)
@click.argument("hostfile", type=click.Path())
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- COMMAND...")
@ssh_options
@click.option(
    "--python",
    metavar="PATH",
    help="Interpreter that runs the small node agent on every node (standard library "
    "only). Default: this orchestrator's interpreter path; a hostfile python wins.",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="On Ctrl-C, time between SIGTERM and SIGKILL.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Stop the command everywhere after this long.",
)
@click.option(
    "--color",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Colour the host prefixes.",
)
@fold_option
def exec_command(hostfile, command, python, grace, timeout, color, fold, **ssh):
    """Run a shell command on every node of HOSTFILE at once.

    Output comes back attributed ([host] line); a table of exit codes ends it. The exit
    status is 0 when the command succeeded everywhere, 1 otherwise. Ctrl-C stops the
    command on every node. Example: orchestrator exec hosts.txt -- nvidia-smi -L
    """
    out = sys.stdout.buffer
    results = run_exec(
        hostfile, " ".join(command), python=python, grace=grace, timeout=timeout,
        console=out, color=color, fold=fold, **ssh,
    )  # fmt: skip
    out.write(results_table(results).encode())
    out.flush()
    return 0 if all(result.ok for result in results) else 1
