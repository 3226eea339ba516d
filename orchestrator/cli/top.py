"""The `top` command: a live table of every rank of a run (console/rank_table.py), drawn by rich."""

from __future__ import annotations

import os
import sys
import time

import click

from orchestrator.cli.context import CONTEXT
from orchestrator.cli.flags import run_dir_option

COLUMNS = (
    ("RANK", "right"),
    ("HOST", "left"),
    ("STATE", "left"),
    ("STEP", "right"),
    ("LOSS", "right"),
    ("SAMPLES/S", "right"),
    ("STEP MS", "right"),
    ("WORK MS", "right"),
    ("SILENT", "right"),
    ("CPU %", "right"),
    ("MEM", "right"),
    ("GPU %", "right"),
    ("GPU MEM", "right"),
    ("", "left"),
)
CHROME_ROWS = 6  # the header line, the table's head, a margin
WIDE = 400  # the line width of a snapshot that is not printed on a terminal


@click.command(context_settings=CONTEXT)
@click.argument("run_id", metavar="RUN")
@run_dir_option
@click.option(
    "--once",
    is_flag=True,
    help="Print one snapshot and exit (as `top -b -n 1`); the default when the output is not "
    "a terminal.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="How often the live table is redrawn.",
)
def top(run_id, run_dir, once, interval):
    """Show every rank of a run, live: state, step, loss, samples/s, step time, its own
    work per step (outside collectives), how long it has been silent, CPU, memory, GPU.

    LOSS, SAMPLES/S, STEP MS and WORK MS cover the rank's latest window, not the whole
    run: with the bundled trainer, the steps of its last progress line (where lines come
    at least once a second; else about the last second), each rank's own samples and
    loss. The header's loss is the ranks' mean and its samples/s their sum, the
    figures of the console's last line.

    SILENT is how long a running rank has said nothing: since its last output line or
    metrics record, whichever came later (`4s`, `2m10s`; blank where a rank is not running
    or has said nothing yet). Once no rank has said anything for 30 s, the header says
    `quiet 2m10s`. A run the hang check found hung (--hang-timeout) says so in the header,
    with its odd group of stacks and where every rank's stacks are; that group's ranks
    come first, flagged `stuck`.

    Outliers come first (a stuck rank, a failed one, a named straggler, one silent or
    slower than the others); when the ranks do not fit the terminal, the others fold by
    node and nodes alike fold together. Works for attached and detached runs, SSH and
    SLURM, and a run that has ended (its last state). The numbers come from the run's
    metrics channel (runs/RUN/metrics.jsonl): the bundled trainer reports to it; any
    program can (see ORCHESTRATOR_METRICS_FILE in the README). Ends when the run ends, or
    on Ctrl-C.
    """
    from rich.console import Console
    from rich.live import Live

    from orchestrator.api.run_handle import Run
    from orchestrator.api.shown import RunView

    view = RunView(Run(run_id, run_dir).record)
    console = Console()
    view.refresh()
    if once or not console.is_terminal or view.ended():
        if not console.is_terminal:  # into a file or a pipe: every column whole, no colour
            console = Console(width=WIDE, color_system=None)
        console.print(render(view, None))
        return 0
    try:
        with Live(render(view, room(console)), console=console, auto_refresh=False) as live:
            while not view.ended():
                time.sleep(interval)
                view.refresh()
                live.update(render(view, room(console)), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0


def room(console) -> int:
    """Rows the table may take on the terminal as it is now. Its size is asked of the
    terminal itself each time: COLUMNS and LINES (which tmux sets once, when a pane
    starts) go stale when the window is resized."""
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
        console.size = (size.columns, size.lines)
    except (OSError, ValueError):
        pass
    return max(4, console.size.height - CHROME_ROWS)


def render(view, rows: int | None):
    """The header line and the table, as one rich renderable."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from orchestrator.api.shown import duration, human_bytes

    now = time.time()
    header = view.header(now)
    if rows is not None:  # a hung run's header takes more lines
        rows = max(1, rows - header.count("\n"))
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name, justify in COLUMNS:
        table.add_column(name, justify=justify, no_wrap=True)

    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    for row in view.rows(now, rows):
        style = "red" if row.severity >= 90 else "yellow" if row.severity else None
        table.add_row(
            row.ranks,
            row.host,
            row.state,
            num(row.step, "d"),
            num(row.loss, ".4f"),
            num(row.samples_per_s, ",.0f"),
            num(row.step_s and row.step_s * 1000, ".1f"),
            num(row.work_s and row.work_s * 1000, ".1f"),
            "" if row.silent_s is None else duration(row.silent_s),
            num(row.cpu_percent, ".0f"),
            "-" if row.rss_bytes is None else human_bytes(row.rss_bytes),
            num(row.gpu_util, ".0f"),
            "-" if row.gpu_mem_bytes is None else human_bytes(row.gpu_mem_bytes),
            row.flag + (f" ({row.count} ranks)" if row.count > 1 else ""),
            style=style,
        )
    return Group(Text(header, style="bold"), table)
