"""A DeepSpeed user's `-i host:1` through the installed console script, as a process: one
rank on slot 1, as --include gives (the in-process cases are tests/unit/cli/test_short_flags.py)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.cli_helpers import run_cli
from tests.unit.cli.test_short_flags import ranks


def test_dash_i_from_the_console_script_is_include(tmp_path: Path) -> None:
    (tmp_path / "h.txt").write_text("localhost slots=2\n")
    (tmp_path / "x.py").write_text("print('x')\n")
    args = ["launch", "h.txt", "-i", "localhost:1", "--dry-run", "--run-dir", "runs", "--", "x.py"]
    result = run_cli(args, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"})
    assert "Traceback" not in result.stderr
    assert ranks(result.returncode, result.stdout, result.stderr) == (
        "world_size: 1",
        ["export CUDA_VISIBLE_DEVICES=1"],
        ["--nproc_per_node=1"],
    )
