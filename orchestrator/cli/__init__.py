"""The command line: the click group and `main` (commands.py), thin commands over the logic
modules (jobs.py, records.py, readiness.py), the click settings and options they share
(context.py, options.py, backend_options.py) and the plain-text views of run records (views.py)."""

from __future__ import annotations

from orchestrator.cli.commands import main

__all__ = ["main"]
