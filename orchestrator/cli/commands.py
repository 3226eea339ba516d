"""The command line: the click group `cli`, its commands registered from the modules that
define them (jobs.py, cleaning.py, records.py, readiness.py, top.py, plotting.py), and
`main`.

Every foreseeable error is an `OrchestratorError`, caught once in `main`: its message is
printed without a traceback and its exit code used (2 for bad input, 1 for a runtime
failure, the failing rank's code for a failed job, 130/143 after Ctrl-C/SIGTERM).
"""

from __future__ import annotations

import logging
import sys

import click

from orchestrator.cli.cleaning import clean
from orchestrator.cli.context import CONTEXT
from orchestrator.cli.jobs import exec_command, launch, render
from orchestrator.cli.plotting import plot
from orchestrator.cli.readiness import check
from orchestrator.cli.records import attach, logs, runs, stacks, status, stop
from orchestrator.cli.top import top
from orchestrator.errors import OrchestratorError
from orchestrator.version import __version__


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="orchestrator")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Also print the debug records of the SSH library (paramiko: key exchange, "
    "authentication, channels) on stderr, each line starting `debug:`. Without it they are "
    "never shown; what they mean reaches you as orchestrator's own messages.",
)
def cli(verbose: bool) -> None:
    """Launch multi-node PyTorch jobs from a hostfile.

    Each node runs torchrun from a generated script (see `render`); every rank's output
    comes back as one attributed stream and lands in runs/<run-id>/. Start with:

        orchestrator launch hostfiles/local.txt
    """
    if verbose:
        logging.basicConfig(
            level=logging.DEBUG, stream=sys.stderr, format="debug: %(name)s: %(message)s"
        )


for command in (
    launch,
    render,
    exec_command,
    logs,
    status,
    top,
    stacks,
    stop,
    attach,
    runs,
    check,
    clean,
    plot,
):
    cli.add_command(command)


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
