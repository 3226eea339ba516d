"""A hung job on the namespace cluster, 4 nodes x 2 ranks: one rank waits forever in a
function of its own before an all_reduce that the 7 others wait in.

`orchestrator stacks` names that rank first (its host, function and file:line) and the 7
others as one group in the all_reduce, within 10 s, by py-spy and by the ranks' own signal
hook alike, and keeps every stack in the run record. With --hang-timeout the run itself
finds the hang: the console names the rank, the run ends `hung` with exit 1, its summary
names the rank, and nothing is left running."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cli_helpers import assert_nothing_left, run_cli, status_of, wait_until

pytestmark = pytest.mark.cluster

NODES, SLOTS, STUCK = 4, 2, 5
JOB = Path(__file__).resolve().parents[1] / "data" / "hang_job.py"
STUCK_LINE = JOB.read_text().splitlines().index("        time.sleep(0.5)") + 1
LAUNCH = ["--env", f"STUCK_RANK={STUCK}", "--", str(JOB)]


def ready(runs: Path, run_id: str) -> bool:
    log = runs / run_id / "logs" / "combined.log"
    return log.exists() and log.read_text(errors="replace").count("ready") >= NODES * SLOTS


def check_groups(lines: list[str], host: str) -> None:
    """The odd rank first, named with its host, function and line; then the 7 others."""
    first, second = lines[0], lines[1]
    assert first.startswith(f"[{host} r{STUCK}] 1 rank: main thread in "), lines
    assert f"wait_for_a_batch_that_never_comes (hang_job.py:{STUCK_LINE})" in first, lines
    assert second.startswith("[") and "7 ranks:" in second and "all_reduce" in second, lines


def test_stacks_name_the_stuck_rank_and_a_hang_ends_the_run(make_cluster, tmp_path: Path):
    runs = tmp_path / "runs"
    with make_cluster(NODES) as cluster:
        hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=SLOTS)
        env = cluster.environ()
        host = cluster.nodes[STUCK // SLOTS].name

        # On demand, on a detached run that does not check for hangs by itself.
        started = run_cli(
            ["launch", str(hostfile), "--run-dir", str(runs), "--run-id", "asked",
             "--detach", "--hang-timeout", "0", *LAUNCH],
            cwd=tmp_path, env=env, timeout=300,
        )  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
        try:
            wait_until(lambda: ready(runs, "asked"), 240, "every rank ready")
            time.sleep(2)  # the 7 reach the all_reduce
            for method in ("auto", "signal"):
                began = time.monotonic()
                shown = run_cli(
                    ["stacks", "asked", "--run-dir", str(runs), "--method", method],
                    env=env, timeout=60,
                )  # fmt: skip
                took = time.monotonic() - began
                assert shown.returncode == 0, shown.stdout + shown.stderr
                lines = shown.stdout.splitlines()
                print(f"stacks --method {method} in {took:.1f} s:\n{shown.stdout}")
                check_groups(lines, host)
                assert took <= 10, f"stacks took {took:.1f} s"
                way = "py-spy" if method == "auto" else "signal"
                assert "stacks of 8 rank(s) taken in" in lines[-1] and f"by {way}" in lines[-1]
                folder = Path(lines[-1].rsplit(" in ", 1)[1])
                assert sorted(p.name for p in folder.glob("rank-*.txt")) == [
                    f"rank-{r}.txt" for r in range(8)
                ]
                kept = json.loads((folder / "stacks.json").read_text())
                assert len(kept["ranks"]) == 8 and kept["groups"][0] == lines[0]
                assert (
                    "wait_for_a_batch_that_never_comes"
                    in (folder / f"rank-{STUCK}.txt").read_text()
                )
        finally:
            run_cli(["stop", "asked", "--run-dir", str(runs), "--wait", "60"], env=env)
        assert_nothing_left("asked")

        # Found by the run itself: --hang-timeout 60.
        began = time.monotonic()
        hung = run_cli(
            ["launch", str(hostfile), "--run-dir", str(runs), "--run-id", "found",
             "--hang-timeout", "60", *LAUNCH],
            cwd=tmp_path, env=env, timeout=600,
        )  # fmt: skip
        took = time.monotonic() - began
        print(hung.stdout)
        assert hung.returncode == 1, hung.stdout + hung.stderr
        console = hung.stdout.splitlines()
        at = next(i for i, line in enumerate(console) if "] hung: no rank printed" in line)
        check_groups([line.removeprefix("[orchestrator] ") for line in console[at + 1 :]], host)
        status = status_of(runs, "found")
        assert status["state"] == "hung" and status["exit_code"] == 1, status
        assert f"[{host} r{STUCK}] 1 rank" in status["summary"].splitlines()[0], status["summary"]
        assert status["hang"]["stacks"], status["hang"]
        assert status["hang"]["stuck_ranks"] == [STUCK], status["hang"]
        # torch's flight recorder, dumped on every node and read by torch's analyser
        assert (
            f"flight recorder: rank {STUCK} ({host}) never joined collective #1 "
            "(gloo:all_reduce, group 0:default_pg) that the other ranks entered ("
        ) in status["summary"], status["summary"]
        flight = sorted(p.name for p in (runs / "found" / "flight").iterdir())
        assert flight == ["analysis.txt", *(f"rank_{r}" for r in range(8))], flight
        assert "run found hung (exit code 1)" in hung.stdout
        assert_nothing_left("found")
        print(f"the hung run ended after {took:.0f} s")
