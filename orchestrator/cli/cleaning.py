"""The `clean` command: remove the nodes' copies of ended runs."""

from __future__ import annotations

import sys

import click

from orchestrator.cli.context import CONTEXT
from orchestrator.cli.options import make_ssh_options, refuse_empty, ssh_options
from orchestrator.errors import ConfigError


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
@click.option(
    "--python",
    metavar="PATH",
    help="Interpreter that runs the node agent on every node. Default: this "
    "orchestrator's interpreter path; a hostfile python wins.",
)
@ssh_options
def clean(hostfile, older_than, dry_run, python, **ssh):
    """Remove the nodes' copies of ended runs (~/.orchestrator/runs/RUN on each node).

    A launch removes each node's copy of a run that succeeded (unless --keep-node-logs);
    the copies of runs that failed, stopped or lost a node stay for a look, until this
    removes them. A run still running on a node (its agent holds the run's lock there) is
    never touched. The run records on this machine (--run-dir) are not touched either.
    Exit status: 0, or 1 when a node could not be cleaned.
    """
    from orchestrator.backends import close_all, connect_cluster
    from orchestrator.hosts.hostfile import load_hostfile
    from orchestrator.nodes.clean import clean_nodes, clean_table, parse_age

    refuse_empty(python=python)
    try:
        age = parse_age(older_than)
    except ValueError as exc:
        raise ConfigError(f"--older-than: {exc}") from None
    cluster = load_hostfile(hostfile)
    connections = connect_cluster(cluster, make_ssh_options(**ssh))
    try:
        pythons = [host.python or python or sys.executable for host in cluster.hosts]
        found, failed = clean_nodes(connections, pythons, age, dry_run)
    finally:
        close_all(connections)
    click.echo(clean_table(found, failed, dry_run))
    return 1 if failed else 0
