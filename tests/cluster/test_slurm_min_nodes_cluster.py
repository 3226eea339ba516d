"""`launch --backend slurm --min-nodes K` on a real SLURM cluster: a node set DOWN mid-run
(`scontrol update nodename=X state=down`) ends the job NODE_FAIL; with no spare, the launcher
submits it again on the two nodes left, the bundled trainer resumes from its checkpoint with
the launch's global batch (ORCHESTRATOR_LAUNCH_WORLD_SIZE); the node then comes back, and the
run grows to three again at a checkpoint (the ranks get SIGUSR1 through their node agents, a
new job on 3 nodes resumes); the run ends exit 0 with the model an uninterrupted run trains.
One run, every assertion (the suite's time is short).

The lab's slurm.conf has ReturnToService=2, under which a DOWN node is taken back as soon as
its slurmd registers again (about a second here), before the launcher could ask which node
failed; a site's ReturnToService=0 or 1 keeps an administrator's DOWN. So the victim's slurmd
is paused (SIGSTOP) for as long as the node is to stay DOWN, and let go (SIGCONT, then
`state=resume`) once the job on two nodes trains.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.lab.slurm import SlurmCluster
from tests.slurm_helpers import (  # noqa: F401 (fixtures, used by name)
    assert_gone,
    combined,
    command,
    launch_args,
    no_job_outlives_its_test,
    status_of,
    wait_for,
    work,
)
from tests.trainer_helpers import load_weights, max_abs_difference, run_trainer

pytestmark = [pytest.mark.cluster, pytest.mark.slurm]

# 3 ranks x batch 4 = a global batch of 12 in 3 blocks of 4 (1 rank x 4 x accum 3 for the
# reference); on 2 ranks after the loss, 2 blocks and 1 (orchestrator/trainer/split.py).
# The node is set DOWN at the first checkpoint (step 20), and let go once the job on two
# nodes trains: the steps left must outlast the DOWN (about 0.3 s), then SLURM taking the
# node back and the launcher asking (every 2 x --heartbeat-timeout: 1 s), at 2.5 ms a step
# or more.
TRAINER = [
    "--synthetic-samples", "4096", "--batch-size", "4", "--epochs", "5", "--max-steps", "800",
    "--no-eval", "--checkpoint-every", "20", "--log-every", "30",
]  # fmt: skip
# Every block's gradient is the launch's and their sum exact (orchestrator/trainer/
# gradients.py), so the weights are the reference's bit for bit, as over SSH
# (tests/cluster/test_shrink_cluster.py).


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_a_node_set_down_mid_run_goes_on_with_one_node_fewer_then_grows_back_to_the_same_model(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    args = launch_args(
        work, "fewer", "--nodes", "3", "--min-nodes", "2", "--heartbeat-timeout", "0.5",
        "--env=OMP_NUM_THREADS=1",
    )  # fmt: skip
    trainer = ["-m", "orchestrator.trainer", *TRAINER, "--checkpoint-dir", "ckpt", "--resume"]
    proc = subprocess.Popen(
        command(*args, "--", *trainer),
        cwd=work,
        env=slurm_cluster.environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    paused, victim, out = None, "", ""
    try:
        wait_for(lambda: list((work / "ckpt").glob("ckpt-*.pt")), 240, "the first checkpoint")
        status = status_of(work, "fewer")
        # Node 0: the batch script's node and the master's (MASTER_ADDR), the hardest to lose.
        first, victim = status["slurm_job_id"], status["nodes"][0]["host"]
        paused = int((slurm_cluster.dir / f"slurmd-{victim}.pid").read_text())
        os.kill(paused, signal.SIGSTOP)
        down = time.time()
        slurm_cluster.run(["scontrol", "update", f"nodename={victim}", "state=down", "reason=t"])
        # The job on two nodes trains: let the node come back (as an administrator would).
        wait_for(lambda: "resumed from ckpt/" in combined(work, "fewer"), 240, "the 2-node job")
        os.kill(paused, signal.SIGCONT)
        back = time.time()
        slurm_cluster.run(["scontrol", "update", f"nodename={victim}", "state=resume"], False)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
        if paused is not None:
            os.kill(paused, signal.SIGCONT)
            slurm_cluster.run(["scontrol", "update", f"nodename={victim}", "state=resume"], False)
            slurm_cluster.wait_idle(timeout=60)
    assert proc.returncode == 0, out
    assert f"{victim} lost; no spare left; going on with 2 of 3 nodes (--min-nodes 2)" in out
    assert f"{victim} back; growing to 3 nodes at the next checkpoint" in out, out
    assert "growing to 3 nodes: SIGUSR1 to 2 rank(s) on 2 node(s)" in out, out
    status = status_of(work, "fewer")
    second, third = status["slurm_job_ids"][1:]
    assert (status["state"], status["nnodes"], status["world_size"], status["min_nodes"]) == (
        "succeeded",
        3,
        3,
        2,
    ), status
    attempts = status["attempts"]
    assert [(s["job_id"], s["nodes"], s["ended"], s["next"]) for s in attempts] == [
        (first, 3, "node-failure", f"resubmitted as job {second} on 2 node(s)"),
        (second, 2, "grow", f"resubmitted as job {third} on 3 node(s)"),
        (third, 3, "completed", None),
    ], attempts
    assert f"ended NODE_FAIL: {victim} is down" in attempts[0]["why"], attempts[0]
    assert attempts[1]["warning"] == "SIGUSR1 to grow to 3 nodes", attempts[1]
    world = status["world"]
    assert [len(entry["nodes"]) for entry in world] == [3, 2, 3], world
    assert victim not in world[1]["nodes"] and victim in world[2]["nodes"], world
    assert f"grow to 3 nodes ({victim} back)" in world[2]["why"], world
    assert status["master"].split(":")[0] == status["nodes"][0]["host"], status
    script = (work / "runs" / "fewer" / "job-2.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in script and f"#SBATCH --exclude={victim}\n" in script
    assert "export ORCHESTRATOR_LAUNCH_WORLD_SIZE=3\n" in script  # the launch's world
    script = (work / "runs" / "fewer" / "job-3.sbatch").read_text()
    assert "#SBATCH --nodes=3\n" in script and "#SBATCH --exclude" not in script
    resumed = [
        int(step) for step in re.findall(r"r0\] resumed from ckpt/ckpt-\d+\.pt at step (\d+)", out)
    ]
    assert len(resumed) == 2 and 0 < resumed[0] < resumed[1], out
    assert "on fewer nodes than the 3 launched with for " in out, out
    print(
        f"set DOWN -> the job on 2 nodes running: "
        f"{_seconds(attempts[1]['running_at']) - down:.1f} s; the first job ended "
        f"{_seconds(attempts[0]['ended_at']) - down:.1f} s after the DOWN; node back -> "
        f"SIGUSR1: {_seconds(attempts[1]['warned_at']) - back:.1f} s, -> the job on 3 nodes "
        f"running: {_seconds(attempts[2]['running_at']) - back:.1f} s; resumed at steps "
        f"{resumed}"
    )
    wait_for(
        lambda: not slurm_cluster.cluster.processes_with_env("ORCHESTRATOR_RUN_ID", "fewer"),
        30,
        "the paused node's processes of the first job to end",
    )
    for job_id in status["slurm_job_ids"]:
        assert_gone(slurm_cluster, job_id, "fewer")

    # The same model as an uninterrupted run of the same global batch: one process here,
    # batch 4 x accum 3.
    plain = run_trainer([*TRAINER, "--grad-accum", "3", "--checkpoint-dir", str(work / "plain")])
    assert plain.returncode == 0, plain.stdout + plain.stderr
    difference = max_abs_difference(
        load_weights(work / "ckpt" / "final.pt"), load_weights(work / "plain" / "final.pt")
    )
    print(f"largest weight difference from the uninterrupted run: {difference:.2e}")
    assert difference == 0.0, difference
