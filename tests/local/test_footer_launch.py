"""launch's footer end to end: the real CLI on a terminal (a pty), real torchrun, 2 local
ranks; the footer's pure parts are in tests/unit/console/test_footer.py."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from tests.cli_helpers import ORCHESTRATOR, REPO, run_cli, run_on_terminal
from tests.unit.console.test_footer import shown

TICKS = textwrap.dedent("""
    import json, os, time
    rank = int(os.environ["RANK"])
    with open(os.environ["ORCHESTRATOR_METRICS_FILE"], "a") as metrics:
        for step in range(1, 9):
            print(f"tick {step} of rank {rank}", flush=True)
            metrics.write(json.dumps({"step": step, "samples_per_s": 10.0}) + "\\n")
            metrics.flush()
            time.sleep(0.5)
""")


def test_launch_on_a_terminal_keeps_a_footer_under_the_stream(tmp_path: Path) -> None:
    (tmp_path / "ticks.py").write_text(TICKS)
    local = str(REPO / "hostfiles" / "local.txt")
    argv = [*ORCHESTRATOR, "launch", local, "--run-dir", str(tmp_path / "runs")]
    code, raw = run_on_terminal(
        [*argv, "--run-id", "tty", "--no-fold", "--", "ticks.py"], cwd=tmp_path
    )
    assert code == 0, raw.decode(errors="replace")
    footers = re.findall(rb"\[orchestrator\] running, 2 rank\(s\) on 1 node\(s\) [^\r\n]*", raw)
    assert footers, raw
    assert any(b"step " in f and b"samples/s" in f for f in footers), footers
    lines = shown(raw)
    for rank in (0, 1):  # every rank line whole, on a line of its own
        ticks = [line for line in lines if f"of rank {rank}" in line]
        assert ticks == [f"[localhost r{rank}] tick {s} of rank {rank}" for s in range(1, 9)]
    # Gone before the closing lines: nothing of it is left on the screen.
    assert not any("running, 2 rank(s)" in line for line in lines), lines
    assert any("run tty succeeded" in line for line in lines), lines
    # --no-footer, or not a terminal: none.
    code, raw = run_on_terminal(
        [*argv, "--run-id", "off", "--no-footer", "--", "ticks.py"], cwd=tmp_path
    )
    assert code == 0 and b"running, 2 rank(s)" not in raw, raw
    piped = run_cli(
        ["launch", local, "--run-dir", str(tmp_path / "runs"), "--", "ticks.py"], cwd=tmp_path
    )
    assert piped.returncode == 0 and "running, 2 rank(s)" not in piped.stdout, piped.stdout
