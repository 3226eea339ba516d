"""The command line: thin click commands (commands.py) over the logic modules, the options they
share (options.py, backend_options.py) and the plain-text views of run records (views.py)."""

from __future__ import annotations

from orchestrator.cli.commands import main

__all__ = ["main"]
