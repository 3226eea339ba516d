"""Node recovery on the namespace cluster (--spares): a node switched off mid-training is
replaced by the spare, the job starts again and the bundled trainer resumes from its
checkpoint to the same weights as a run that never lost a node; a rank that fails by itself
never uses a spare. Real sshd, real torchrun, real power loss (link down, SIGKILL)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from tests.cli_helpers import assert_nothing_left, run_cli, start_cli, status_of, wait_until
from tests.goodput_helpers import assert_goodput
from tests.lab import bad_days
from tests.trainer_helpers import (
    RESUME_TOLERANCE,
    load_weights,
    max_abs_difference,
    run_torchrun,
)

pytestmark = pytest.mark.cluster

# About 170 optimizer steps on 3 ranks (2048 samples, batch 8, 2 epochs); a checkpoint every
# 10 steps, so a node switched off after the first one loses at most 10 steps of work.
TRAIN = [
    "--synthetic-samples", "2048", "--batch-size", "8", "--epochs", "2", "--no-eval",
    "--checkpoint-every", "10", "--log-every", "20",
]  # fmt: skip
# A node switched off is lost once its agent has been silent this long and its sshd does
# not answer either: no claim here waits for a number, only for the loss, so a short one
# (a busy node is asked through its sshd before it is called lost: not a false loss).
HEARTBEAT = 3


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The final weights of the same training on 3 ranks that nothing interrupted."""
    where = tmp_path_factory.mktemp("uninterrupted")
    done = run_torchrun(3, [*TRAIN, "--checkpoint-dir", str(where)], timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    return load_weights(where / "final.pt")


def launch_argv(hostfile: Path, runs: Path, run_id: str, checkpoints: Path, *args: str):
    return [
        "launch", str(hostfile), "--run-dir", str(runs), "--run-id", run_id, "--color", "never",
        "--env=OMP_NUM_THREADS=1", "--heartbeat-timeout", str(HEARTBEAT), "--grace", "3",
        *args, "--", "-m", "orchestrator.trainer", *TRAIN,
        "--checkpoint-dir", str(checkpoints), "--resume",
    ]  # fmt: skip


def test_a_node_switched_off_is_replaced_by_the_spare_and_training_resumes(
    make_cluster, tmp_path: Path, uninterrupted
) -> None:
    with make_cluster(4) as own:
        for victim_rank in (2, 0):  # a worker, then the master
            switch_off_mid_training(own, tmp_path, victim_rank, uninterrupted)


def first_checkpoint(proc, checkpoints: Path) -> None:
    """Wait for the trainer's first checkpoint; fail at once if the launch ended before."""
    wait_until(
        lambda: any(checkpoints.glob("ckpt-*.pt")) or proc.poll() is not None,
        300,
        "the first checkpoint",
    )
    assert proc.poll() is None, proc.communicate()[0]


def switch_off_mid_training(own, tmp_path: Path, victim_rank: int, uninterrupted: dict) -> None:
    hostfile = own.write_hostfile(tmp_path / "hosts.txt", slots=1)
    spare, victim = own.nodes[3], own.nodes[victim_rank]
    run_id = f"spare-for-node{victim_rank}"
    checkpoints = tmp_path / f"ckpt-{run_id}"
    bad = tmp_path / f"bad-{run_id}.txt"
    argv = launch_argv(
        hostfile, tmp_path / "runs", run_id, checkpoints, "--spares", "1", "--bad-nodes", str(bad)
    )
    proc = start_cli(argv, cwd=tmp_path, env=own.environ())
    try:
        first_checkpoint(proc, checkpoints)
        with bad_days.powered_off(own, victim):
            out, _ = proc.communicate(timeout=600)
            assert_nothing_left(run_id)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert f"{victim.name}: lost" in out, out
    assert f"attempt 2: {victim.name} (lost: " in out, out
    assert f"replaced by {spare.name} as node {victim_rank}" in out, out
    assert f"run {run_id} succeeded" in out, out
    status = status_of(tmp_path / "runs", run_id)
    assert status["state"] == "succeeded" and status["exit_code"] == 0, status
    (recovery,) = status["recoveries"]
    assert recovery["node"] == victim.name and recovery["spare"] == spare.name, status
    assert recovery["why"].startswith("lost: "), recovery
    assert recovery["seconds_to_running"] is not None, recovery
    assert status["spares"] == [] and status["attempt"] == 2, status
    hosts = [n["host"] for n in status["nodes"]]
    assert hosts[victim_rank] == spare.name and victim.name not in hosts, status
    assert victim.name in bad.read_text(), bad.read_text()
    # The resumed training ends where an uninterrupted one does.
    final = load_weights(checkpoints / "final.pt")
    assert max_abs_difference(final, uninterrupted) <= RESUME_TOLERANCE
    # Both attempts are in the record: rank files continue, the log marks attempt 2.
    combined = (tmp_path / "runs" / run_id / "logs" / "combined.log").read_text()
    assert f"[orchestrator] attempt 2: {victim.name}" in combined
    logs = run_cli(["logs", run_id, "--run-dir", str(tmp_path / "runs"), "--grep", "attempt"])
    assert f"attempt 2: {victim.name}" in logs.stdout, logs.stdout + logs.stderr
    assert_nothing_left(run_id)  # also on the victim, now that it is back
    assert not bad_days.agent_pids(own, victim, run_id)
    assert_goodput_of_the_fault(tmp_path / "runs", run_id, out, status)
    # A later launch with the list skips the victim, in one line.
    later = run_cli(
        ["render", str(hostfile), "-o", str(tmp_path / f"r-{run_id}"), "--bad-nodes", str(bad),
         "--", "x.py"],
        cwd=tmp_path,
    )  # fmt: skip
    assert later.returncode == 0, later.stderr
    assert f"skipping 1 host(s) on the bad-node list {bad}: {victim.name}" in later.stderr


def test_a_rank_that_fails_by_itself_uses_no_spare(cluster, tmp_path: Path) -> None:
    (tmp_path / "fail.py").write_text("import sys; print('failing', flush=True); sys.exit(3)\n")
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=1)
    run_id = "job-error"
    done = run_cli(
        ["launch", str(hostfile), "--run-dir", str(tmp_path / "runs"), "--run-id", run_id,
         "--color", "never", "--spares", "1", "--", "fail.py"],
        cwd=tmp_path,
        env=cluster.environ(),
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 3, out
    assert "attempt 2" not in out and "replaced by" not in out, out
    spare = cluster.nodes[-1].name
    status = status_of(tmp_path / "runs", run_id)
    assert status["state"] == "failed" and status["recoveries"] == [], status
    assert status["spares"] == [spare], status
    assert spare not in [n["host"] for n in status["nodes"]], status
    combined = (tmp_path / "runs" / run_id / "logs" / "combined.log").read_text()
    assert f"[{spare} r" not in combined, combined  # no rank ever ran on the spare
    assert_nothing_left(run_id)


def test_a_host_down_before_the_start_is_replaced_by_the_spare(make_cluster, tmp_path) -> None:
    (tmp_path / "hello.py").write_text("import os; print('hello from', os.environ['RANK'])\n")
    with make_cluster(3) as own:
        hostfile = own.write_hostfile(tmp_path / "hosts.txt", slots=1)
        down, spare = own.nodes[1], own.nodes[2]
        with bad_days.powered_off(own, down):
            done = run_cli(
                ["launch", str(hostfile), "--run-dir", str(tmp_path / "runs"), "--run-id",
                 "down-at-start", "--color", "never", "--spares", "1", "--connect-timeout", "3",
                 "--", "hello.py"],
                cwd=tmp_path,
                env=own.environ(),
            )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert f"{down.name} taken out (" in out and f"spare {spare.name} takes node rank 1" in out
    assert f"[{spare.name} r1] hello from 1" in out, out
    status = status_of(tmp_path / "runs", "down-at-start")
    assert [n["host"] for n in status["nodes"]] == [own.nodes[0].name, spare.name], status
    (recovery,) = status["recoveries"]
    assert recovery["node"] == down.name and recovery["spare"] == spare.name, recovery
    assert_nothing_left("down-at-start")


def assert_goodput_of_the_fault(runs: Path, run_id: str, out: str, status: dict) -> None:
    """The goodput adds up and says the same everywhere (tests/goodput_helpers.py), and the
    steps it counts as redone are those between the checkpoint attempt 2 resumed from (as
    the trainer says) and the last step attempt 1 reported before the fault (a record of
    steps, or a checkpoint's mark: the node goes off at the first checkpoint, before the
    first record of steps is due)."""
    goodput = assert_goodput(runs, run_id, out)
    resumed = int(re.findall(r"resumed from \S+ at step (\d+)", out)[-1])
    second_since = datetime.fromisoformat(status["world"][1]["since"].replace("Z", "+00:00"))
    records = [json.loads(line) for line in (runs / run_id / "metrics.jsonl").open()]
    reported = max(
        r["metrics"].get("step", r["metrics"].get("checkpoint", -1))
        for r in records
        if isinstance(r.get("metrics"), dict) and r["time"] < second_since.timestamp()
    )
    first, second = goodput["attempts"]
    assert first["steps"][1] == reported and second["steps"][0] == resumed, goodput
    assert resumed % 10 == 0 and goodput["redone_steps"] == max(0, reported - resumed), goodput
    (fault,) = goodput["faults"]["each"]
    assert fault["event"] == "lost" and 0 < fault["detect_s"] < 4 * HEARTBEAT, fault
    assert goodput["phases"]["checkpoints"] > 0 and 0 < goodput["ratio"] < 1, goodput
    print(
        f"goodput of {run_id}: {json.dumps({k: goodput[k] for k in ('wall_s', 'ratio')})} "
        f"phases {goodput['phases']} faults {goodput['faults']} "
        f"(last step reported {reported}, resumed from {resumed})"
    )
