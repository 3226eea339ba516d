"""The command line: thin click commands over the logic modules.

Every foreseeable error is an `OrchestratorError`, caught once in `main`: its message is
printed without a traceback and its exit code used (2 for bad input, 1 for a runtime
failure, the failing rank's code for a failed job, 130/143 after Ctrl-C/SIGTERM).
"""

from __future__ import annotations

import os
import sys

import click

from orchestrator import __version__
from orchestrator.cli.backend_options import (
    HostfileOptional,
    backend_options,
    check_backend,
    make_slurm_options,
    split_hostfile,
)
from orchestrator.cli.options import (
    gpus_chosen,
    job_options,
    make_spec,
    make_ssh_options,
    refuse_empty,
    run_dir_option,
    run_options,
    select,
    selection_options,
    split_selection,
    split_ssh,
    ssh_options,
)
from orchestrator.errors import ConfigError, OrchestratorError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


# --- commands ----------------------------------------------------------------------------


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="orchestrator")
def cli() -> None:
    """Launch multi-node PyTorch jobs from a hostfile.

    Each node runs torchrun from a generated script (see `render`); every rank's output
    comes back as one attributed stream and lands in runs/<run-id>/. Start with:

        orchestrator launch hostfiles/local.txt
    """


@cli.command(cls=HostfileOptional, context_settings=CONTEXT)
@click.argument("hostfile", type=click.Path(), required=False)
@click.argument("program", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT ARGS...]")
@job_options
@selection_options
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
    default=True,
    help="Skip probing the nodes (python, torch, interface, port) before starting.",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="On a failure or Ctrl-C, how long ranks get between SIGTERM and SIGKILL.",
)
@click.option(
    "--heartbeat-timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="A node silent this long is lost (the run stops); a node that hears "
    "nothing from the orchestrator this long stops its part by itself.",
)
@click.option(
    "--color",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Colour the rank prefixes.",
)
def launch(
    hostfile,
    program,
    dry_run,
    detach,
    preflight,
    grace,
    heartbeat_timeout,
    color,
    run_id,
    run_dir,
    backend,
    login,
    **job,
):
    """Run a job on every node of HOSTFILE.

    Without a script, runs the bundled DDP trainer (python -m orchestrator.trainer).
    Give your own after `--`: `orchestrator launch hosts.txt -- train.py --lr 0.1`
    (or `-- -m package.module ...`). Exit status: 0 when every rank succeeded, else the
    first failing rank's exit code (130 after Ctrl-C, 2 for bad input).

    With --backend slurm, one sbatch job runs it (`launch --backend slurm --nodes 2
    --partition gpu -- train.py`): the job id is printed, then its state and the ranks'
    output; Ctrl-C cancels the job.
    """
    from orchestrator.launcher import LaunchOptions
    from orchestrator.launcher import launch as run_launch
    from orchestrator.runs import check_run_id, new_run_id

    ssh = make_ssh_options(**split_ssh(job))
    selection = split_selection(job)
    hostfile, program = split_hostfile(hostfile, program)
    slurm = make_slurm_options(job, login)
    if backend != "slurm" and login:
        raise ConfigError("--login applies to --backend slurm only")
    cluster = None
    if backend != "slurm":
        cluster = select(check_backend(backend, slurm, hostfile), selection, job["nproc_per_node"])
    spec = make_spec(program, gpus_chosen=gpus_chosen(selection, cluster, backend), **job)
    options = LaunchOptions(
        run_dir=run_dir,
        run_id=check_run_id(run_id) if run_id else new_run_id(),
        argv=tuple(["orchestrator", *sys.argv[1:]]),
        grace=grace,
        heartbeat_timeout=heartbeat_timeout,
        color=color,
        preflight=preflight,
        ssh=ssh,
    )
    if backend == "slurm":
        from orchestrator.hostfile import load_hostfile
        from orchestrator.slurm.submit import launch_slurm

        cluster = select(
            load_hostfile(hostfile) if hostfile else None, selection, job["nproc_per_node"]
        )
        return launch_slurm(cluster, spec, slurm, options, dry_run=dry_run, detach=detach)
    return run_launch(cluster, spec, options, dry_run=dry_run, detach=detach)


@cli.command(cls=HostfileOptional, context_settings=CONTEXT)
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
@backend_options
def render(hostfile, program, out_dir, run_id, backend, **job):
    """Write the plan and one torchrun script per node, without touching any node.

    Each script runs by hand on its node: `bash DIR/node0.sh` on the first node, and so on.
    Interfaces are picked by the scripts when they start (no probe here); MASTER_PORT is
    29500 unless given. With --backend slurm: DIR/job.sbatch, to submit with
    `sbatch DIR/job.sbatch` (the ranks' output then goes to slurm-<jobid>.out).
    """
    from orchestrator.hostfile import load_hostfile
    from orchestrator.launcher import LaunchOptions, check_script_exists, prepare
    from orchestrator.render import write_rendered
    from orchestrator.runs import check_run_id, new_run_id

    hostfile, program = split_hostfile(hostfile, program)
    slurm = make_slurm_options(job)
    selection = split_selection(job)
    if backend == "slurm":
        from orchestrator.slurm.submit import write_slurm_render

        cluster = select(
            load_hostfile(hostfile) if hostfile else None, selection, job["nproc_per_node"]
        )
        spec = make_spec(program, gpus_chosen=gpus_chosen(selection, cluster, backend), **job)
        for path in write_slurm_render(
            out_dir,
            cluster,
            spec,
            slurm,
            check_run_id(run_id) if run_id else new_run_id(),
            tuple(["orchestrator", *sys.argv[1:]]),
        ):
            click.echo(str(path))
        return 0
    cluster = select(check_backend(backend, slurm, hostfile), selection, job["nproc_per_node"])
    spec = make_spec(program, gpus_chosen=gpus_chosen(selection, cluster, backend), **job)
    check_script_exists(cluster, spec)  # as launch does, when every node is this machine
    options = LaunchOptions(
        run_dir="",
        run_id=check_run_id(run_id) if run_id else new_run_id(),
        argv=tuple(["orchestrator", *sys.argv[1:]]),
    )
    plan, scripts = prepare(cluster, spec, options, connections=None)
    for path in write_rendered(out_dir, plan, scripts):
        click.echo(str(path))
    return 0


@cli.command("exec", context_settings=CONTEXT)
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
def exec_command(hostfile, command, python, grace, timeout, color, **ssh):
    """Run a shell command on every node of HOSTFILE at once.

    Output comes back attributed ([host] line); a table of exit codes ends it. The exit
    status is 0 when the command succeeded everywhere, 1 otherwise. Ctrl-C stops the
    command on every node. Example: orchestrator exec hosts.txt -- nvidia-smi -L
    """
    from orchestrator.execute import exec_on_cluster
    from orchestrator.hostfile import load_hostfile

    refuse_empty(python=python)
    cluster = load_hostfile(hostfile)
    return exec_on_cluster(
        cluster,
        " ".join(command),
        python or sys.executable,
        make_ssh_options(**ssh),
        grace=grace,
        time_limit=timeout,
        color=color,
    )


@cli.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@run_dir_option
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends.")
@click.option("--rank", type=int, default=None, help="Only this global rank's output.")
@click.option("--node", metavar="HOST", help="Only lines of this node's ranks and its torchrun.")
@click.option("--grep", metavar="REGEX", help="Only lines matching REGEX.")
@click.option(
    "--tail",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Start with the last N lines instead of the whole log.",
)
def logs(run_id, run_dir, follow, rank, node, grep, tail):
    """Print a run's combined log (or one rank's), or follow it while it runs."""
    import re

    from orchestrator.logs import follow as follow_file
    from orchestrator.logs import last_lines_of, line_filter
    from orchestrator.runs import FINAL_STATES, RunRecord, controller_alive

    record = RunRecord.open(run_dir, run_id)
    if grep is not None:
        try:
            re.compile(grep)
        except re.error as exc:
            raise ConfigError(f"--grep {grep!r} is not a valid regular expression: {exc}") from None
    status = record.read_status()
    if rank is not None:
        if not 0 <= rank < int(status.get("world_size") or 0):
            raise ConfigError(
                f"--rank {rank}: run {run_id} has ranks 0-{int(status.get('world_size') or 0) - 1}"
            )
        path = record.logs_dir / f"rank-{rank}.log"
    else:
        path = record.logs_dir / "combined.log"
    keep = line_filter(grep, node)
    out = sys.stdout.buffer

    def done() -> bool:
        current = record.read_status()
        return current.get("state") in FINAL_STATES or not controller_alive(current)

    if tail is not None:
        end = path.stat().st_size if path.exists() else 0  # the tail, then follow from here
        for line in last_lines_of(path, tail, end=end, keep=keep if grep or node else None):
            out.write(line)
        out.flush()
        lines = follow_file(path, done, offset=end) if follow else iter(())
    else:
        lines = follow_file(path, done if follow else (lambda: True))
    try:
        for line in lines:
            if keep(line):
                out.write(line)
                out.flush()
    except BrokenPipeError:
        pass
    return 0


@cli.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@run_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print status.json as it is.")
def status(run_id, run_dir, as_json):
    """Show a run's state, per node and per rank."""
    import json

    from orchestrator.cli.views import status_text
    from orchestrator.runs import RunRecord

    record = RunRecord.open(run_dir, run_id)
    current = record.read_status()
    if current.get("backend") == "slurm":  # squeue/sacct's word on a run not yet ended
        from orchestrator.slurm.commands import refresh_status

        current = refresh_status(record, current)
    click.echo(json.dumps(current, indent=2) if as_json else status_text(current))
    return 0


@cli.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@run_dir_option
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for the run to end.",
)
def stop(run_id, run_dir, wait):
    """Stop a running run on every node (SIGTERM, then SIGKILL after its grace).

    Works from any shell; stopping again kills at once.
    """
    from orchestrator.control import stop_run
    from orchestrator.runs import RunRecord

    return stop_run(RunRecord.open(run_dir, run_id), wait, say=click.echo)


@cli.command(context_settings=CONTEXT)
@run_dir_option
def runs(run_dir):
    """List the runs in --run-dir with their state."""
    from orchestrator.cli.views import runs_table
    from orchestrator.runs import list_runs

    click.echo(runs_table(list_runs(run_dir), run_dir))
    return 0


@cli.command(context_settings=CONTEXT)
@click.argument("hostfile", type=click.Path())
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Ranks per node. Default: each host's slots (1 for a bare host).",
)
@click.option(
    "--master-addr",
    metavar="ADDR",
    help="Rendezvous address to test. Default: the first node, as reached by ssh.",
)
@click.option(
    "--master-port",
    default="auto",
    show_default=True,
    metavar="PORT|auto",
    help="Rendezvous port to test and use. 'auto': 29500 when free on the master, else a free one.",
)
@click.option(
    "--ifname",
    metavar="IFACE",
    help="Interface for NCCL and gloo on every node (a hostfile ifname wins). "
    "Default: the one whose route reaches MASTER_ADDR.",
)
@click.option(
    "--python",
    metavar="PATH",
    help="Interpreter on every node. Default: this orchestrator's interpreter path; "
    "a hostfile python wins for its node.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "nccl", "gloo"]),
    default="auto",
    show_default=True,
    help="auto: NCCL when every node has CUDA devices, else gloo.",
)
@click.option(
    "--max-size",
    metavar="SIZE",
    help="Largest message of the bandwidth sweep (from 1K, doubling), e.g. 64M or "
    "1G. Default: 64M with gloo, 1G with NCCL.",
)
@click.option("--skip-bandwidth", is_flag=True, help="Check the collectives only.")
@click.option(
    "--json",
    "json_path",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Also write the whole report as JSON to FILE.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=180.0,
    show_default=True,
    metavar="SECONDS",
    help="Give up on the collectives job after this long.",
)
@click.option(
    "--run-id",
    metavar="NAME",
    help="Name of the check's run. Default: the time and a random suffix.",
)
@run_dir_option
@selection_options
@ssh_options
def check(
    hostfile,
    nproc_per_node,
    master_addr,
    master_port,
    ifname,
    python,
    backend,
    max_size,
    skip_bandwidth,
    json_path,
    timeout,
    run_id,
    run_dir,
    **ssh,
):
    """Prove that the nodes of HOSTFILE are ready for a job.

    Per node, in parallel: SSH round trip, python, torch, NCCL, CUDA devices vs slots, the
    NCCL/gloo interface and whether it can open a TCP connection to MASTER_ADDR:MASTER_PORT,
    free disk. Then a real job on every slot (a normal run in --run-dir): all_reduce,
    reduce_scatter, all_gather, broadcast and barrier, each checked against the exact value
    every rank must get, and an all_reduce/all_gather bandwidth sweep (algbw and busbw as
    nccl-tests computes them). Exit status 0 only when everything passed; otherwise 1, with
    what to fix.
    """
    from orchestrator.check.run import CheckOptions, check_json_path, parse_max_size, run_check
    from orchestrator.hostfile import load_hostfile
    from orchestrator.runs import check_run_id, new_run_id
    from orchestrator.spec import parse_master_port

    if max_size is not None:
        max_size = parse_max_size(max_size)
    refuse_empty(ifname=ifname, python=python)
    if json_path is not None:
        check_json_path(json_path)
    selection = split_selection(ssh)
    cluster = select(load_hostfile(hostfile), selection, nproc_per_node)
    options = CheckOptions(
        run_dir=run_dir,
        run_id=check_run_id(run_id) if run_id else new_run_id(),
        argv=tuple(["orchestrator", *sys.argv[1:]]),
        python=python or sys.executable,
        nproc_per_node=nproc_per_node,
        master_addr=master_addr,
        master_port=parse_master_port(master_port),
        ifname=ifname,
        backend=backend,
        max_size=max_size,
        skip_bandwidth=skip_bandwidth,
        timeout=timeout,
        json_path=json_path,
        ssh=make_ssh_options(**ssh),
    )
    if os.path.exists(os.path.join(run_dir, options.run_id)):
        raise ConfigError(
            f"run {options.run_id!r} already exists in {run_dir}; choose another --run-id"
        )
    return run_check(cluster, options)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turn errors into messages and exit codes."""
    try:
        code = cli.main(args=argv, prog_name="orchestrator", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("orchestrator: aborted", err=True)
        code = 130
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except OrchestratorError as exc:
        click.echo(f"orchestrator: error: {exc}", err=True)
        code = exc.exit_code
    except KeyboardInterrupt:
        click.echo("orchestrator: interrupted; nothing was started", err=True)
        code = 130
    sys.exit(code if isinstance(code, int) else 0)
