"""`orchestrator check` on this machine alone (a localhost hostfile): the whole path
without the namespace lab, plus its bad-input handling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.check import measure


def orchestrator(
    *args: str, cwd: Path, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def test_help_does_not_import_torch(tmp_path: Path) -> None:
    code = (
        "import sys; from orchestrator.cli import main\n"
        "try:\n    main(['check', '--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--max-size SIZE" in done.stdout and "--json FILE" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-size", "12Q"], "--max-size: '12Q' is not a size"),
        (["--nproc-per-node", "0"], "--nproc-per-node"),
        (["--master-port", "70000"], "--master-port must be a number from 1 to 65535"),
        (
            ["--include", "localhost:5"],
            "--include 'localhost:5': host localhost has no slot 5 "
            "(its slots are 0-1; hosts.txt:1)",
        ),
        (["--exclude", "nosuch"], "--exclude 'nosuch': host 'nosuch' is not in hosts.txt"),
        (["--exclude", "localhost"], "--exclude 'localhost' leaves no slot on any host"),
    ],
)
def test_bad_input_exits_2_before_touching_a_node(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "hosts.txt").write_text("localhost slots=2\n")
    done = orchestrator("check", "hosts.txt", *args, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_check_passes_on_localhost(tmp_path: Path) -> None:
    (tmp_path / "hosts.txt").write_text("localhost slots=2\n")
    temp = tmp_path / "tmp"  # where torchrun would make its torchelastic_* folder if not told
    temp.mkdir()
    done = orchestrator(
        "check",
        "hosts.txt",
        "--max-size",
        "64K",
        "--json",
        "report.json",
        "--run-id",
        "local-check",
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] and report["world_size"] == 2 and report["problems"] == []
    assert report["nodes"][0]["probe"]["ifname"] == "lo"
    assert report["nodes"][0]["slot_ids"] is None  # no selection: local rank i uses GPU i
    assert all(row["ok"] for row in report["collectives"])
    assert len(report["bandwidth"]) == 2 * len(measure.sweep_sizes(64 << 10))
    assert "[0, 1] on every rank" in done.stdout
    runs = orchestrator("runs", cwd=tmp_path)
    assert "local-check" in runs.stdout and "succeeded" in runs.stdout
    assert list(temp.glob("torchelastic_*")) == [], "torchrun left its folder in TMPDIR"
