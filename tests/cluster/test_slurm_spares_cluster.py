"""`launch --backend slurm --spares N` on a real SLURM cluster: a node switched off mid-run
(link down, every process of its namespace killed, slurmd included) is replaced by
submitting the job again without it; a rank's own error uses no spare.

SLURM notices the node after the lab's SlurmdTimeout (tests/lab/slurm.py), marks it DOWN
and ends the job NODE_FAIL; the launcher then submits it again with the node excluded.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.goodput_helpers import assert_goodput
from tests.lab.slurm import SlurmCluster
from tests.slurm_helpers import (  # noqa: F401 (fixtures, used by name)
    assert_gone,
    combined,
    command,
    launch_args,
    no_job_outlives_its_test,
    orchestrator,
    status_of,
    wait_for,
    work,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slurm]

# Waits on the first job; in a later job (its marker written by another job id) it joins an
# all_reduce over the new set of nodes and exits 0: a program resuming from its checkpoint.
# On the metrics channel it reports its steps as the bundled trainer does (record/goodput/):
# 12 steps in the first job, checkpoints at 5 and 10, then the wait the fault ends; resumed
# from step 10, 4 steps more. Steps 11 and 12 are redone.
RESUMING = """\
import json, os, sys, time
from pathlib import Path
rank, job, node = os.environ["RANK"], os.environ["SLURM_JOB_ID"], os.environ["SLURMD_NODENAME"]
channel = open(os.environ["ORCHESTRATOR_METRICS_FILE"], "a", buffering=1)
def report(**record):
    channel.write(json.dumps({**record, "time": time.time()}) + "\\n")
def train(first, last):
    report(from_step=first)
    for step in range(first + 1, last + 1):
        time.sleep(0.2)
        report(step=step, steps=1, step_s=0.2)
        if step % 5 == 0 and rank == "0":
            time.sleep(0.05)
            report(checkpoint=step, save_s=0.05)
mark = Path(sys.argv[1]) / f"rank-{rank}"
if mark.exists() and mark.read_text() != job:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    train(10, 14)
    print(f"rank {rank} resumed on {node} in job {job}: all_reduce {value.item():g}", flush=True)
    ok = value.item() == dist.get_world_size()
    dist.destroy_process_group()
    raise SystemExit(0 if ok else 1)
mark.write_text(job)
train(0, 12)
print(f"rank {rank} up on {node} in job {job}", flush=True)
time.sleep(300)
"""


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_a_node_switched_off_is_replaced_by_a_new_job_without_it(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    (work / "resuming.py").write_text(RESUMING)
    (work / "ckpt").mkdir()
    bad = work / "bad-nodes.txt"
    args = launch_args(work, "spare", "--nodes", "2", "--spares", "1", "--bad-nodes", str(bad))
    proc = subprocess.Popen(
        command(*args, "--", "resuming.py", "ckpt"),
        cwd=work,
        env=slurm_cluster.environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    victim = None
    try:
        wait_for(lambda: combined(work, "spare").count(" up on ") == 2, 60, "both ranks up")
        first = re.findall(r"rank (\d) up on (\S+) in job (\d+)", combined(work, "spare"))
        nodes = {rank: node for rank, node, _ in first}
        victim = next(n for n in slurm_cluster.nodes if n.name == nodes["1"])  # not the batch host
        off = time.time()
        slurm_cluster.power_off(victim)
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
        if victim is not None:
            slurm_cluster.power_on(victim)
    assert proc.returncode == 0, out
    status = status_of(work, "spare")
    assert status["state"] == "succeeded", out
    [recovery] = status["recoveries"]
    (spare,) = {n.name for n in slurm_cluster.nodes} - set(nodes.values())
    assert (recovery["node"], recovery["spare"], recovery["attempt"]) == (victim.name, spare, 2)
    assert "NODE_FAIL" in recovery["why"], recovery
    assert status["spares_left"] == 0 and len(status["slurm_job_ids"]) == 2, status
    resumed = re.findall(r"rank (\d) resumed on (\S+) in job \d+: all_reduce 2", out)
    assert sorted(resumed) == sorted([("0", nodes["0"]), ("1", spare)]), out
    assert f"--exclude={victim.name}" in (work / "runs" / "spare" / "job-2.sbatch").read_text()
    listed = [line.split()[0] for line in bad.read_text().splitlines() if line[:1] != "#"]
    assert listed == [victim.name], bad.read_text()
    assert "recovered from 1 node failure(s)" in out, out
    seen, running = _seconds(recovery["noticed_at"]), _seconds(recovery["running_again_at"])
    print(
        f"switched off -> NODE_FAIL seen: {seen - off:.1f} s; -> the new job running: "
        f"{running - off:.1f} s (seen -> running {recovery['seconds_to_running']} s)"
    )
    for job_id in status["slurm_job_ids"]:
        assert_gone(slurm_cluster, job_id, "spare")
    # Where its wall time went: the second job's queue, the steps after the checkpoint of 10
    # done again, the fault's detection; the same in status.json, `status` and the last line.
    goodput = assert_goodput(work / "runs", "spare", out)
    first, second = goodput["attempts"]
    assert (first["steps"], second["steps"]) == ([0, 12], [10, 14]), goodput
    assert goodput["redone_steps"] == 12 - 10 and goodput["faults"]["count"] == 1, goodput
    assert goodput["phases"]["checkpoints"] > 0 and goodput["phases"]["redone"] > 0, goodput
    assert second["phases"]["waiting"] > 0, goodput  # the new job's time in SLURM's queue
    print(f"goodput: {json.dumps({k: goodput[k] for k in ('wall_s', 'ratio', 'phases')})}")
    print(f"goodput faults: {goodput['faults']}")


def test_a_rank_that_fails_by_itself_uses_no_spare(slurm_cluster: SlurmCluster, work: Path) -> None:
    bad = work / "bad-nodes.txt"
    done = orchestrator(
        slurm_cluster,
        work,
        *launch_args(work, "own", "--nodes", "2", "--spares", "1", "--bad-nodes", str(bad)),
        "--env",
        "FAIL_RANK=1",
        "--",
        "ranks.py",
    )
    assert done.returncode == 3, done.stdout + done.stderr
    status = status_of(work, "own")
    assert (status["state"], status["recoveries"], status["spares_left"]) == ("failed", [], 1)
    assert "slurm_job_ids" not in status and not bad.exists()
    assert_gone(slurm_cluster, status["slurm_job_id"], "own")


def test_more_spares_than_the_partition_holds_is_bad_input(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    done = orchestrator(
        slurm_cluster, work, *launch_args(work, "many", "--nodes", "2", "--spares", "2"), "--",
        "ranks.py",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--spares 2 with --nodes 2" in done.stderr and "Traceback" not in done.stderr
    assert slurm_cluster.run(["squeue", "-h"]).stdout.strip() == ""


# Reports its steps as the bundled trainer does, every rank's step 0.2 s; the ranks of the
# node where rank 1 ran first report 6x the others' own work (the run waits for them: slow on
# both signals). On the warning signal it "checkpoints" and exits 138, as the trainer does;
# in a later job it runs 10 steps and exits 0.
SLOWING = """\
import json, os, signal, sys, time
from pathlib import Path
rank, job, node = os.environ["RANK"], os.environ["SLURM_JOB_ID"], os.environ["SLURMD_NODENAME"]
channel = open(os.environ["ORCHESTRATOR_METRICS_FILE"], "a", buffering=1)
def report(**record):
    channel.write(json.dumps({**record, "time": time.time()}) + "\\n")
warned = []
signal.signal(signal.SIGUSR1, lambda *_: warned.append(1))
where, mark = Path(sys.argv[1]), Path(sys.argv[1]) / f"rank-{rank}"
first = not mark.exists()
mark.write_text(job)
if first and rank == "1":
    (where / "slow").write_text(node)
time.sleep(0.5)
slow = (where / "slow").exists() and (where / "slow").read_text() == node
report(from_step=0)
for step in range(1, 10_000):
    time.sleep(0.2)
    report(step=step, steps=1, step_s=0.2, work_s=0.18 if slow else 0.03)
    if warned:
        print(f"rank {rank} on {node} checkpointed at step {step} in job {job}", flush=True)
        raise SystemExit(138)
    if not first and step == 10:
        print(f"rank {rank} on {node} done in job {job}", flush=True)
        raise SystemExit(0)
"""


def test_a_slow_node_is_swapped_for_the_spare_at_a_checkpoint(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    (work / "slowing.py").write_text(SLOWING)
    (work / "state").mkdir()
    bad = work / "bad-nodes.txt"
    args = launch_args(
        work, "slow", "--nodes", "2", "--spares", "1", "--bad-nodes", str(bad),
        "--stragglers", "1.5,3", "--swap-stragglers-after", "6",
    )  # fmt: skip
    done = orchestrator(slurm_cluster, work, *args, "--", "slowing.py", "state")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    victim = (work / "state" / "slow").read_text()
    status = status_of(work, "slow")
    assert status["state"] == "succeeded", out
    [recovery] = status["recoveries"]
    assert recovery["node"] == victim and recovery["attempt"] == 2, recovery
    assert recovery["why"].startswith("slow: rank 1's step work 6.0x the median for "), recovery
    assert f"straggler swap: {victim} (node 1) slow for " in out, out
    assert "taking it out at a checkpoint now: a spare takes its place" in out, out
    first_job = status["slurm_job_ids"][0]
    assert f"SLURM job {first_job} stopped at its checkpoint to take out slow {victim}" in out
    assert f"--exclude={victim}" in (work / "runs" / "slow" / "job-2.sbatch").read_text()
    listed = [line.split()[0] for line in bad.read_text().splitlines() if line[:1] != "#"]
    assert listed == [victim], bad.read_text()
    done_on = re.findall(r"rank (\d) on (\S+) done in job", out)
    assert len(done_on) == 2 and victim not in {node for _, node in done_on}, out
    assert status["attempts"][0]["ended"] == "slow", status["attempts"]
    for job_id in status["slurm_job_ids"]:
        assert_gone(slurm_cluster, job_id, "slow")
