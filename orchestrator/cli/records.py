"""The commands over the run records in --run-dir: `logs`, `status`, `stop`, `stacks`,
`attach` and `runs`."""

from __future__ import annotations

import sys

import click

from orchestrator.cli.context import CONTEXT
from orchestrator.cli.flags import WholeNumber, fold_option, options_of, run_dir_option
from orchestrator.errors import ConfigError
from orchestrator.options.display import ConsoleOptions


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@run_dir_option
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends.")
@click.option("--rank", type=WholeNumber(), default=None, help="Only this global rank's output.")
@click.option("--node", metavar="HOST", help="Only lines of this node's ranks and its torchrun.")
@click.option("--grep", metavar="REGEX", help="Only lines matching REGEX.")
@click.option(
    "--tail",
    type=WholeNumber(minimum=0),
    default=None,
    metavar="N",
    help="Start with the last N lines instead of the whole log.",
)
@click.option(
    "--torchrun-reports",
    is_flag=True,
    help="Also print torchrun's own reports of a failure it did not cause (its "
    "ChildFailedError block) and of its shutdown after a stop (its traceback), which the "
    "console leaves to the node logs; combined.log keeps them.",
)
@click.option(
    "--fetch",
    is_flag=True,
    help="Complete the rank files that the run record could not take whole (its disk "
    "was full) from the nodes' copies, then exit.",
)
@fold_option
def logs(run_id, run_dir, follow, rank, node, grep, tail, torchrun_reports, fetch, fold):
    """Print a run's combined log (or one rank's), or follow it while it runs: the run's
    console, as the launch showed it (torchrun's own failure and shutdown reports left out,
    see --torchrun-reports).

    With --fetch: complete the rank files that status.json lists as incomplete, from
    the nodes' copies (reached as the launch reached them), one line per file completed.
    """
    from orchestrator.api.run_handle import Run, log_bytes

    run = Run(run_id, run_dir)
    if fetch:
        if follow or rank is not None or node or grep or tail is not None:
            raise ConfigError("--fetch completes the rank files and prints no log: give it alone")
        return run.fetch_incomplete(say=click.echo)
    out = sys.stdout.buffer
    lines = log_bytes(run.record, rank, follow, tail, torchrun_reports, grep, node, fold)
    try:
        for line in lines:
            if line:
                out.write(line)
                out.flush()
    except BrokenPipeError:
        pass
    return 0


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@run_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print status.json as it is.")
def status(run_id, run_dir, as_json):
    """Show a run's state, per node and per rank."""
    import json

    from orchestrator.api.run_handle import Run
    from orchestrator.cli.views import status_text

    current = Run(run_id, run_dir).status().document
    click.echo(json.dumps(current, indent=2) if as_json else status_text(current))
    return 0


@click.command(context_settings=CONTEXT)
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
    from orchestrator.api.run_handle import Run
    from orchestrator.api.stop import stop_run

    return stop_run(Run(run_id, run_dir).record, wait, say=click.echo)


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@run_dir_option
@click.option("--rank", type=WholeNumber(), default=None, help="Only this global rank's stack.")
@click.option("--node", metavar="HOST", help="Only the stacks of this node's ranks.")
@click.option(
    "--method",
    type=click.Choice(["auto", "py-spy", "signal"]),
    default="auto",
    show_default=True,
    help="How each rank's stack is read: py-spy from outside (stops the rank for about a "
    "millisecond; needs ptrace), or the rank's own interpreter on a signal (through the "
    "hook every launch installs); auto: py-spy where it works, else the signal.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the whole answer as JSON.")
def stacks(run_id, run_dir, rank, node, method, as_json):
    """Show every rank's Python stack (all threads), taken now, folded.

    Every node's agent reads its ranks at the same moment, without stopping the job.
    Ranks whose stacks are the same are one group, the smallest group first: in a hung
    job the odd rank out, and where it waits, is the first line. Each stack is also kept
    whole in runs/RUN/stacks/TIME/ (rank-N.txt and stacks.json). For SSH and local runs,
    attached or detached.
    """
    import json

    from orchestrator.api.rank_stacks import stack_lines
    from orchestrator.api.run_handle import Run

    answer = Run(run_id, run_dir).stacks(method)
    if as_json:
        click.echo(json.dumps(answer, indent=1))
    else:
        for line in stack_lines(answer, rank, node):
            click.echo(line)
    return 0


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@run_dir_option
@click.option(
    "--detach",
    is_flag=True,
    help="Follow it from a controller in the background, and return once it has taken over.",
)
@options_of(ConsoleOptions, ["color"])
def attach(run_id, run_dir, detach, color):
    """Take over a SLURM run whose controller is gone, and follow it to its end.

    The job is SLURM's: it goes on when the controller that launched it dies (a login
    node that rebooted, a closed terminal, kill -9). `attach` starts a new controller in
    its place: every node's output goes on from where the old one had read it (no line
    lost, none written twice), and stacks, hang checks, resubmissions after a node
    failure or a time limit, and the final status work as under the launch. The console
    is the launch's; Ctrl-C cancels the job. Exit status: the run's, as `launch` gives it.
    A run over SSH has nothing to attach to: its nodes stop when its controller is gone.
    """
    from orchestrator.api.taking_over import take_over, take_over_detached

    if not detach:
        return take_over(run_id, run_dir, sys.stdout.buffer, color)
    job_id = take_over_detached(run_id, run_dir)
    click.echo(f"run {run_id}: SLURM job {job_id} followed again in the background")
    click.echo(f"  follow it:  orchestrator logs {run_id} -f --run-dir {run_dir}")
    return 0


@click.command(context_settings=CONTEXT)
@run_dir_option
def runs(run_dir):
    """List the runs in --run-dir with their state."""
    from orchestrator.api.run_handle import runs_in
    from orchestrator.cli.views import runs_table

    click.echo(runs_table(runs_in(run_dir), run_dir))
    return 0
