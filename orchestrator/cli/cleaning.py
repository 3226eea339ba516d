"""The `clean` command: remove the nodes' copies of ended runs."""

from __future__ import annotations

import click

from orchestrator.api.node_tasks import clean_nodes
from orchestrator.cli.context import CONTEXT
from orchestrator.cli.flags import options_of
from orchestrator.options.reaching import SshOptions
from orchestrator.options.workload import JobOptions

CLEAN_PYTHON = (
    "Interpreter that runs the node agent on every node. Default: this orchestrator's "
    "interpreter path; a hostfile python wins."
)


@click.command("clean", context_settings=CONTEXT)
@click.argument("hostfile", type=click.Path())
@click.option(
    "--older-than",
    default="0",
    show_default=True,
    metavar="AGE",
    help="Only runs whose newest file is at least this old: 7d, 12h, 30m, 90s.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@options_of(JobOptions, ["python"], helps={"python": CLEAN_PYTHON})
@options_of(SshOptions)
def clean(hostfile, older_than, dry_run, **keywords):
    """Remove the nodes' copies of ended runs (~/.orchestrator/runs/RUN on each node).

    A launch removes each node's copy of a run that succeeded (unless --keep-node-logs);
    the copies of runs that failed, stopped or lost a node stay for a look, until this
    removes them. A run still running on a node (its agent holds the run's lock there) is
    never touched. The run records on this machine (--run-dir) are not touched either.
    Exit status: 0, or 1 when a node could not be cleaned.
    """
    table, cleaned = clean_nodes(hostfile, older_than=older_than, dry_run=dry_run, **keywords)
    click.echo(table)
    return 0 if cleaned else 1
