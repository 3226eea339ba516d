"""The command line: the click group and `main` (commands.py), thin commands over the logic
modules (jobs.py, records.py, readiness.py), the click settings and options they share
(context.py, options.py, backend_options.py) and the plain-text views of run records (views.py).

cleaning.py           the `clean` command: remove the nodes' copies of ended runs
flags.py              the command line's options, made from the option groups' fields
hostfile_argument.py  what `launch` and `render` share beyond the option groups
plotting.py           the `plot` command
top.py                the `top` command
"""

from __future__ import annotations

from orchestrator.cli.commands import main

__all__ = ["main"]
