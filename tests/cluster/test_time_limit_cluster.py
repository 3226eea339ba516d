"""`launch --time` over SSH on the namespace cluster, 2 nodes x 2 ranks of a program of the
user's own (not the bundled trainer): each rank gets SIGUSR1 the default 6 s before a 24 s
limit, writes its checkpoint and exits, and the run ends failed (124) on the warning, not as
a crash; a program that ignores the signal runs into the limit and is stopped there, its
ranks named. Each test ends by looking at the process table."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.cli_helpers import assert_nothing_left, run_cli, status_of

pytestmark = pytest.mark.cluster

PROGRAM = """\
import os, signal, sys, time
rank, folder, how = os.environ["RANK"], sys.argv[1], sys.argv[2]
def checkpoint(signum, frame):
    with open(os.path.join(folder, f"rank-{rank}.ckpt"), "w") as out:
        out.write(f"{time.time():.6f}\\n")
    print(f"rank {rank}: SIG{signal.Signals(signum).name[3:]}, checkpoint written", flush=True)
    sys.exit(128 + signum)
signal.signal(signal.SIGUSR1, checkpoint if how == "catch" else signal.SIG_IGN)
print(f"rank {rank} started", flush=True)
while True:
    time.sleep(0.1)
"""


# The warned run's limit and its default warning (a quarter of it). The warning comes
# LIMIT - WARNING = 18 s in: the ranks (plain python, no torch) have started and caught
# SIGUSR1 by then, as the ignoring run's 4 ranks have at 12 s (its 16 s limit, 4 s ahead).
LIMIT, WARNING = 24, 6


def launch(cluster, tmp_path: Path, run_id: str, limit: str, how: str):
    (tmp_path / "program.py").write_text(PROGRAM)
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", nodes=[0, 1], slots=2)
    folder = tmp_path / run_id
    folder.mkdir()
    argv = ["launch", str(hostfile), "--run-dir", str(tmp_path / "runs"), "--run-id", run_id]
    argv += ["--color", "never", "--time", limit, "--", "program.py", str(folder), how]
    started = time.time()
    done = run_cli(argv, cwd=tmp_path, env=cluster.environ(), timeout=120)
    return done, folder, time.time() - started


def wall(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_every_rank_gets_the_warning_saves_and_exits_before_the_limit(
    cluster, tmp_path: Path
) -> None:
    done, folder, took = launch(cluster, tmp_path, "warned", f"0:{LIMIT}", "catch")
    out = done.stdout + done.stderr
    assert done.returncode == 124, out
    assert f"time limit {LIMIT} s; SIGUSR1 to every rank {WARNING} s before" in out
    assert f"time limit in {WARNING} s: SIGUSR1 to 4 rank(s) on 2 node(s)" in out
    status = status_of(tmp_path / "runs", "warned")
    warning = status["warning"]
    assert warning["signal"] == "USR1" and warning["before_limit_s"] == WARNING, warning
    assert warning["ranks_signalled"] == 4 and warning["ranks_not_catching_it"] == [], warning
    sent = wall(warning["sent_at"])
    limit_at = wall(status["started_at"]) + LIMIT
    for rank in range(4):
        saved = float((folder / f"rank-{rank}.ckpt").read_text())
        assert sent <= saved < sent + 3, (rank, saved - sent)
        assert WARNING - 3 < limit_at - saved <= WARNING + 0.5, (rank, limit_at - saved)
        assert f"rank {rank}: SIGUSR1, checkpoint written" in out
    assert status["state"] == "failed" and status["exit_code"] == 124, status
    assert status["summary"].startswith(
        f"stopped on the time limit's warning (SIGUSR1 {WARNING} s before the {LIMIT} s limit): "
        "every rank exited after it"
    ), status["summary"]
    assert "running_at_limit" not in status and took < LIMIT, took
    assert all(r["state"] == "stopped" for r in status["ranks"]), status["ranks"]
    assert "failed with" not in out and "failed first" not in out, out
    assert_nothing_left("warned")


def test_ranks_that_ignore_the_warning_are_stopped_at_the_limit(cluster, tmp_path: Path) -> None:
    done, folder, took = launch(cluster, tmp_path, "ignored", "0:16", "ignore")
    out = done.stdout + done.stderr
    assert done.returncode == 124, out
    assert "time limit in 4 s: SIGUSR1 to 4 rank(s) on 2 node(s)" in out
    assert "2 rank(s) do not catch SIGUSR1: not sent it (they run on to the limit)" in out
    status = status_of(tmp_path / "runs", "ignored")
    assert status["state"] == "failed" and status["running_at_limit"] == [0, 1, 2, 3], status
    hosts = [node.name for node in cluster.nodes[:2]]
    assert status["summary"] == (
        "stopped: time limit of 16 s reached; the warning went out 4 s before it; still "
        f"running at the limit (stopped then): rank 0 on {hosts[0]}, rank 1 on {hosts[0]}, "
        f"rank 2 on {hosts[1]}, rank 3 on {hosts[1]}"
    ), status["summary"]
    assert not list(folder.iterdir()) and took >= 16, took
    assert_nothing_left("ignored")
