"""A slow node swapped at a checkpoint, on the namespace cluster: 4 nodes and a spare
(--spares 1), one node's rank slowed from outside (its CPU capped by a cgroup, as
test_top_cluster.py does) from its first step on is named a straggler, taken out at a
checkpoint once it stayed slow for --swap-stragglers-after, replaced by the spare, and the
run ends as an unslowed one does: exit 0, the same final weights, steps per second after
the swap at least 0.9x those of unslowed runs measured here, one before and one after it
(over the same steps). Slowed for half the bound, then not: named, never swapped."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.cli_helpers import assert_nothing_left, start_cli, status_of, wait_until
from tests.lab.bad_days import cpu_capped, cpu_cgroup_root
from tests.trainer_helpers import RESUME_TOLERANCE, load_weights, max_abs_difference

pytestmark = pytest.mark.cluster

NODES = 4  # and one spare
VICTIM = 1  # a worker's node, not node 0's rank 0 (whose records the rates are read from)
CAP = 0.05  # of one core, for every thread of the slowed rank together
WINDOW, AFTER = 5, 20  # --stragglers 1.5,WINDOW; --swap-stragglers-after AFTER
CHECKPOINT_EVERY = 100
# 128 steps an epoch on 4 ranks, 2048 steps in all: about 30 s unslowed here.
TRAIN = [
    "--synthetic-samples", "4096", "--batch-size", "8", "--epochs", "16", "--no-eval",
    "--log-every", "64", "--checkpoint-every", str(CHECKPOINT_EVERY),
]  # fmt: skip


def launch(own, tmp_path: Path, run_id: str):
    hostfile = own.write_hostfile(tmp_path / "hosts.txt", slots=1)  # the last one: the spare
    argv = [
        "launch", str(hostfile), "--run-dir", str(tmp_path / "runs"), "--run-id", run_id,
        "--color", "never", "--env=OMP_NUM_THREADS=1", "--spares", "1",
        "--bad-nodes", str(tmp_path / f"bad-{run_id}.txt"),
        "--stragglers", f"1.5,{WINDOW}", "--swap-stragglers-after", str(AFTER),
        "--", "-m", "orchestrator.trainer", *TRAIN,
        "--checkpoint-dir", str(tmp_path / f"ckpt-{run_id}"), "--resume",
    ]  # fmt: skip
    return start_cli(argv, cwd=tmp_path, env=own.environ())


def rank_pids(own, node) -> list[int]:
    return [p.pid for p in own.processes_on(node) if p.has_env("RANK")]


def slowed(own, proc, node, tmp_path: Path, run_id: str, seconds: float | None = None) -> None:
    """Cap the CPU of `node`'s rank from its first step (the metrics of `tmp_path`'s run
    `run_id`) until it ends, or for `seconds`. From its first step, not its start: a rank
    capped while it imports torch starts late, not slow, and the cap must be tight enough
    that its small steps are slow however loaded the machine is (at 0.15 of a core, a CI
    run's slowed steps kept the unslowed pace)."""

    def begun() -> bool:
        path = tmp_path / "runs" / run_id / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return any('"step":' in line and f'"rank":{VICTIM},' in line for line in lines)

    wait_until(lambda: begun() or proc.poll() is not None, 180, "the rank's first step")
    assert proc.poll() is None, proc.communicate()[0]
    with cpu_capped(rank_pids(own, node), CAP):
        began = time.monotonic()
        while proc.poll() is None and rank_pids(own, node):
            if seconds is not None and time.monotonic() - began >= seconds:
                return
            time.sleep(0.5)


def finish(proc, run_id: str) -> str:
    try:
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert_nothing_left(run_id)
    return out


def records(tmp_path: Path, run_id: str) -> list[dict]:
    path = tmp_path / "runs" / run_id / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def steps_per_second(found: list[dict], from_step: int | None = None) -> tuple[float, int]:
    """Rank 0's steps per second in the run's last attempt (from its last start mark), or
    over the steps after `from_step`: one over the median step time of its records,
    leaving out the first two (warming up); and the step that attempt began at. A median,
    since the machine is shared: a moment of another's load is not the run's pace."""
    mine = [r["metrics"] for r in found if r.get("rank") == 0 and "metrics" in r]
    last = max(i for i, m in enumerate(mine) if "from_step" in m)
    began = mine[last]["from_step"]
    times = sorted(
        [m["step_s"] for m in mine[last:] if "step_s" in m and m["step"] > (from_step or 0)][2:]
    )
    assert len(times) >= 5, times
    return 1 / times[len(times) // 2], began


def test_a_node_slowed_from_outside_is_swapped_for_the_spare_at_a_checkpoint(
    make_cluster, tmp_path: Path
) -> None:
    if cpu_cgroup_root() is None:
        pytest.skip("no writable cgroup cpu controller here to slow a node with")
    with make_cluster(NODES + 1) as own:
        victim, spare = own.nodes[VICTIM], own.nodes[NODES]
        # Unslowed: nothing named, nothing swapped; its pace and weights are the bar.
        proc = launch(own, tmp_path, "unslowed")
        out = finish(proc, "unslowed")
        assert "straggler" not in out, out
        unslowed_records = records(tmp_path, "unslowed")
        # Slowed for the whole run: swapped at a checkpoint, the spare in.
        proc = launch(own, tmp_path, "slowed")
        slowed(own, proc, victim, tmp_path, "slowed")
        out = finish(proc, "slowed")
        # Unslowed again, so that the bar brackets the slowed run (the machine is shared:
        # its pace drifts between runs).
        proc = launch(own, tmp_path, "unslowed-again")
        finish(proc, "unslowed-again")
        # Slowed for half the bound, then not: named, never swapped.
        proc = launch(own, tmp_path, "burst")
        slowed(own, proc, victim, tmp_path, "burst", AFTER / 2)
        burst = finish(proc, "burst")
    print(out, file=sys.stderr)
    assert f"straggler swap: {victim.name} (node {VICTIM}) slow for" in out, out
    assert "taking it out at a checkpoint now: a spare takes its place" in out, out
    assert f"{victim.name} taken out (slow: rank {VICTIM}'s step work" in out, out
    assert f"spare {spare.name} takes node rank {VICTIM}" in out, out
    assert "run slowed succeeded" in out and "lost to 1 slow node swapped (detect 0.0 s" in out
    status = status_of(tmp_path / "runs", "slowed")
    (recovery,) = status["recoveries"]
    assert (recovery["node"], recovery["spare"]) == (victim.name, spare.name), recovery
    assert recovery["why"].startswith(f"slow: rank {VICTIM}'s step work"), recovery
    assert status["attempt"] == 2 and status["exit_code"] == 0, status
    assert victim.name in (tmp_path / "bad-slowed.txt").read_text()
    # Swapped within the bound plus one checkpoint interval of being named.
    found = records(tmp_path, "slowed")
    (named,) = [r["time"] for r in found if r.get("event") == "straggler"]
    (swapped,) = [r["time"] for r in found if r.get("event") == "swap"]
    stopped_at = min(
        r["metrics"]["time"]
        for r in found
        if r.get("rank") == 0 and "checkpoint" in r.get("metrics", {}) and r["time"] >= swapped
    )
    slow_pace = [
        r["metrics"]["step_s"]
        for r in found
        if r.get("rank") == 0 and "step_s" in r.get("metrics", {}) and r["time"] < swapped
    ]
    interval = CHECKPOINT_EVERY * sorted(slow_pace)[len(slow_pace) // 2]
    assert stopped_at - named <= AFTER + interval + 2, (named, swapped, stopped_at, interval)
    # The pace after the swap against the unslowed run's over the same steps.
    after, resumed = steps_per_second(found)
    before, _ = steps_per_second(unslowed_records, resumed)
    later, _ = steps_per_second(records(tmp_path, "unslowed-again"), resumed)
    unslowed = (before + later) / 2
    print(
        f"unslowed {unslowed:.1f} steps/s ({before:.1f} before, {later:.1f} after); "
        f"after the swap {after:.1f} steps/s "
        f"({after / unslowed:.2f}x); named -> swap {swapped - named:.1f} s, -> stopped at "
        f"its checkpoint {stopped_at - named:.1f} s (a checkpoint interval: {interval:.1f} s)",
        file=sys.stderr,
    )
    assert after >= 0.9 * unslowed, (after, unslowed)
    final = load_weights(tmp_path / "ckpt-slowed" / "final.pt")
    bar = load_weights(tmp_path / "ckpt-unslowed" / "final.pt")
    assert max_abs_difference(final, bar) <= RESUME_TOLERANCE
    # The burst: seen, and left alone.
    assert f"straggler: rank {VICTIM} on {victim.name}" in burst, burst
    assert (
        "straggler swap" not in burst and status_of(tmp_path / "runs", "burst")["recoveries"] == []
    ), burst
