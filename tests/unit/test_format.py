"""One formatter and one linter hold the whole tree: a file that drifts from `ruff format`
or breaks a `ruff check` rule fails the suite, with the diff or the findings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_every_file_is_formatted():
    done = ruff("format", "--check", "--diff")
    assert done.returncode == 0, (
        "files drift from `ruff format` (run `ruff format .`):\n" + done.stdout + done.stderr
    )


def test_lint_is_clean():
    done = ruff("check", "--quiet")
    assert done.returncode == 0, "`ruff check .` finds:\n" + done.stdout + done.stderr
