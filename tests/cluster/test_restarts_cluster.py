"""--max-restarts on the namespace cluster: a rank crashes once, torchrun restarts the
workers on every node, the bundled trainer resumes from its checkpoint and ends with the
same model as a run that never crashed. Real sshd, real torchrun (c10d rendezvous)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli_helpers import assert_nothing_left, run_cli, status_of
from tests.trainer_helpers import (
    CRASH_ONCE,
    CRASH_ONCE_ARGS,
    RESUME_TOLERANCE,
    load_weights,
    max_abs_difference,
)

pytestmark = pytest.mark.cluster


def launch(cluster, tmp_path: Path, run_id: str, *args: str, crash_rank: int | None = None):
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=1)
    checkpoints = tmp_path / f"ckpt-{run_id}"
    env = [f"--env=CRASH_ONCE_RANK={crash_rank}"] if crash_rank is not None else []
    result = run_cli(
        [
            "launch",
            str(hostfile),
            "--run-dir",
            str(tmp_path / "runs"),
            "--run-id",
            run_id,
            "--color",
            "never",
            "--env=OMP_NUM_THREADS=1",
            *env,
            *args,
            "--",
            str(CRASH_ONCE),
            *CRASH_ONCE_ARGS,
            "--checkpoint-dir",
            str(checkpoints),
        ],
        cwd=tmp_path,
        env=cluster.environ(),
        timeout=400,
    )
    return result, checkpoints


def test_a_rank_crashing_once_restarts_and_resumes_to_the_same_model(cluster, tmp_path) -> None:
    crashed, crashed_ckpt = launch(
        cluster, tmp_path, "crash-once", "--max-restarts", "1", crash_rank=2
    )
    out = crashed.stdout + crashed.stderr
    assert crashed.returncode == 0, out
    node2 = cluster.nodes[2].name
    assert (
        f"rank 2 on {node2} failed with exit code 3; torchrun restarts the workers "
        "(--max-restarts 1 per node)" in out
    ), out
    assert re.search(
        rf"restarted 1 time\(s\) \(--max-restarts 1\):\n.*restart 1: rank 2 on "
        rf"{node2} ended with exit code 3 after [\d.]+ s",
        out,
    ), out
    status = status_of(tmp_path / "runs", "crash-once")
    assert status["state"] == "succeeded" and status["restarts"] == 1, status
    assert status["restart_causes"][0].startswith(
        f"restart 1: rank 2 on {node2} ended with exit code 3"
    ), status
    assert [r["state"] for r in status["ranks"]] == ["succeeded"] * 3
    logs = tmp_path / "runs" / "crash-once" / "logs"
    rank2 = (logs / "rank-2.log").read_text()
    assert "rank 2 crashing once (attempt 0)" in rank2
    assert rank2.split("crashing once")[1].count("rank 2/3 started") == 1, rank2  # again
    rank0 = (logs / "rank-0.log").read_text()  # rank 0 reports the trainer's progress
    assert re.search(
        rf"resumed from {re.escape(str(crashed_ckpt))}/ckpt-\d+\.pt at step "
        r"[1-9]",
        rank0,
    ), rank0
    assert_nothing_left("crash-once")

    plain, plain_ckpt = launch(cluster, tmp_path, "uninterrupted")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "restart" not in plain.stdout
    assert status_of(tmp_path / "runs", "uninterrupted")["restarts"] == 0
    difference = max_abs_difference(
        load_weights(crashed_ckpt / "final.pt"), load_weights(plain_ckpt / "final.pt")
    )
    assert difference <= RESUME_TOLERANCE, difference
