"""What every launch test of a run's goodput checks (record/goodput/): its phases add up to
the run's wall time, and status.json, `orchestrator status` and the run's last line say the
same figures."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.record.goodput.words import goodput_line, goodput_table
from tests.cli_helpers import run_cli, status_of


def console_wall(out: str, run_id: str) -> float:
    """The run's wall time as its closing line says it (`succeeded in 12.3 s`, `after ...`)."""
    found = re.findall(rf"run {re.escape(run_id)} (?:succeeded in|.* after) ([\d.]+) s", out)
    assert found, out
    return float(found[-1])


def assert_goodput(run_dir: Path, run_id: str, out: str, env=None) -> dict:
    """status.json's goodput, once checked: its phases (and each attempt's) add up to the
    wall time within 1 %, the wall time is the one the console said, and the last line
    and `status` say its figures."""
    status = status_of(run_dir, run_id)
    goodput = status["goodput"]
    wall = goodput["wall_s"]
    assert abs(sum(goodput["phases"].values()) - wall) <= 0.01 * wall, goodput
    for attempt in goodput["attempts"]:
        assert abs(sum(attempt["phases"].values()) - attempt["wall_s"]) <= 0.01 * wall, attempt
    assert abs(sum(a["wall_s"] for a in goodput["attempts"]) - wall) <= 0.01 * wall, goodput
    said = console_wall(out, run_id)
    assert abs(wall - said) <= max(0.01 * said, 0.05), (wall, said)
    line = goodput_line(goodput)
    assert out.rstrip().splitlines()[-1] == f"[orchestrator] {line}", out[-2000:]
    if goodput["steps"]:
        assert line.startswith(f"goodput {goodput['ratio'] * 100:.0f} %"), line
    shown = run_cli(["status", run_id, "--run-dir", str(run_dir)], env=env)
    assert shown.returncode == 0, shown.stderr
    for row in goodput_table(goodput):
        assert row in shown.stdout.splitlines(), (row, shown.stdout)
    return goodput
