"""The `plot` command: a run's metrics.jsonl drawn as one PNG (matplotlib, an optional extra)."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.context import CONTEXT
from orchestrator.cli.flags import run_dir_option


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@run_dir_option
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Where to write the PNG. Default: plot.png in the run's folder (DIR/RUN/plot.png).",
)
def plot(run_id, run_dir, output):
    """Draw a run's progress as one PNG and print its path.

    Four panels, from runs/RUN/metrics.jsonl: the loss of every rank over steps, the
    samples/s of every rank over steps, a timeline with one row per node (waiting
    from preflight to start, running from start to end; marks where a node failed, was
    lost, restarted or had a straggler; a dashed line where the run was stopped), and
    where the wall time went (its goodput: one bar coloured by phase; see docs/goodput.md).

    Works on a run still going (it draws what is there so far). Needs matplotlib:
    pip install 'orchestrator[plot]'.
    """
    from orchestrator.api.run_handle import Run
    from orchestrator.api.shown import draw, load

    record = Run(run_id, run_dir).record
    run = load(record.path)
    if run.skipped:
        click.echo(
            f"warning: {run.skipped} unparsable line{'s' if run.skipped != 1 else ''} "
            f"in {record.path / 'metrics.jsonl'} skipped",
            err=True,
        )
    written = draw(run, Path(output) if output else record.path / "plot.png")
    click.echo(str(written))
    return 0
