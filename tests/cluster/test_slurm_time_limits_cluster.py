"""Long runs on a real SLURM cluster outliving their jobs: a time limit or a preemption ends a
job in a checkpoint, and `launch` carries the run on in the next one; a cancel ends it.

The lab's slurm.conf (tests/lab/slurm.py) has a second partition, `urgent`, whose jobs
preempt the default one's (PreemptMode=REQUEUE, GraceTime 20 s, the job's --signal sent at
once). Every test ends by checking that SLURM no longer lists the job and that no process
of the run is left on any node.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.lab.slurm import URGENT_PARTITION, SlurmCluster
from tests.slurm_helpers import (  # noqa: F401 (fixtures, used by name)
    assert_gone,
    assert_model_of_an_uninterrupted_run,
    combined,
    command,
    job_id_in,
    launch_args,
    no_job_outlives_its_test,
    orchestrator,
    status_of,
    wait_for,
    work,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slurm]

# SLURM's warning comes 15-45 s into a one-minute job (slurmctld looks at time limits
# every 30 s, a compile-time constant, and sends --signal's warning up to that much early)
# and the ranks start a few seconds in, so a job trains for 10-43 s. The steps are paced,
# one every 20 ms at most (tests/data/paced_trainer.py): 2600 steps last 52 s on the clock
# whatever the machine's speed and load, so the run crosses at least one limit (two jobs,
# three when the first is warned early), while the unpaced trainer reaches the same weights
# for the comparison in seconds.
STEPS = 2600
TRAINER_ARGS = [
    "--synthetic-samples",
    "1024",
    "--epochs",
    "100000",
    "--max-steps",
    str(STEPS),
    "--log-every",
    "500",
]
PACED_TRAINER = Path(__file__).resolve().parents[1] / "data" / "paced_trainer.py"


def test_a_trainer_run_is_carried_across_one_minute_limits_to_the_uninterrupted_model(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    """--time 1 with 52 s of work: each job's ranks are warned 15 s before its
    limit, save and stop; `launch` submits the next job, the trainer resumes; the run ends
    with exit 0 and the weights of an uninterrupted run, every job in status.json."""
    done = orchestrator(
        slurm_cluster,
        work,
        *launch_args(
            work,
            "long",
            "--nodes",
            "2",
            "--time",
            "1",
            "--env=OMP_NUM_THREADS=1",
            "--env=PACED_STEP_S=0.02",
            "--",
            str(PACED_TRAINER),
            *TRAINER_ARGS,
            "--checkpoint-dir",
            "ckpt-long",
            "--resume",
        ),
        timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    status = status_of(work, "long")
    attempts = status["attempts"]
    assert len(attempts) >= 2, attempts
    assert [s["ended"] for s in attempts] == ["time-limit"] * (len(attempts) - 1) + ["completed"]
    ids = [s["job_id"] for s in attempts]
    assert len(set(ids)) == len(ids) and status["slurm_job_ids"] == ids, status
    for attempt, after in zip(attempts, ids[1:], strict=False):
        assert attempt["next"] == f"resubmitted as job {after}"
        assert attempt["warning"] == "SIGUSR1 for the time limit" and attempt["warned_at"]
        assert f"attempt {ids.index(after) + 1}: SLURM job {after} submitted, after job " in out
    assert (status["state"], status["exit_code"]) == ("succeeded", 0)
    assert status["resubmits_left"] == 10 - (len(attempts) - 1)  # the default, 10
    saves = re.findall(
        rf"stopped by SIGUSR1 after step \d+/{STEPS}; checkpoint saved to \S+ in ", out
    )
    assert len(saves) == len(attempts) - 1, out
    resumed = re.findall(r"r0\] resumed from ckpt-long/ckpt-\d+\.pt at step (\d+)", out)
    assert len(resumed) == len(attempts) - 1 and all(int(s) > 0 for s in resumed), out
    print(f"{len(attempts)} jobs, resumed at steps {', '.join(resumed)} of {STEPS}")
    assert re.search(rf"carried across {len(attempts)} attempt\(s\):\n", out), out
    shown = orchestrator(slurm_cluster, work, "status", "long", "--run-dir", str(work / "runs"))
    assert f"attempts: {len(attempts)} (resubmits left: " in shown.stdout, shown.stdout
    assert re.search(
        rf"1\. job {ids[0]} on 2 node\(s\) ran \S+: its ranks stopped on the time limit",
        shown.stdout,
    )
    assert_gone(slurm_cluster, ids[-1], "long")

    assert_model_of_an_uninterrupted_run(
        slurm_cluster, work, "ckpt-long", ["--", "-m", "orchestrator.trainer", *TRAINER_ARGS]
    )


def _waiting_ranks(
    slurm: SlurmCluster, work: Path, run_id: str, *env: str
) -> subprocess.Popen[str]:
    """`launch` of 2 nodes of checkpointing.py with a 5-minute limit (so a --signal), in the
    background, `env` its --env flags; returned once both ranks wait for their SIGUSR1 (or
    one, LATE_RANK, for the warning before it installs its handler)."""
    proc = subprocess.Popen(
        command(
            *launch_args(
                work, run_id, "--nodes", "2", "--time", "5", *env, "--", "checkpointing.py", "ckpt"
            )
        ),
        cwd=work,
        env=slurm.environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: (
                len(re.findall(r"rank \d (waiting for SIGUSR1|starting)", combined(work, run_id)))
                == 2
            ),
            120,
            "ranks",
        )
    except BaseException:
        proc.kill()
        raise
    return proc


def test_a_preempted_job_resumes_and_a_stopped_one_is_never_resubmitted(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    """A job of the `urgent` partition takes every node: SLURM sends the run's ranks their
    SIGUSR1 at once (--time 5 asks for one), they save and stop, the script ends, and
    `launch` submits the job again; it starts once the urgent job is done, the ranks
    resume and the run succeeds. Made to race on purpose: rank 1 is still starting when
    the warning comes (its handler comes after it: node 1's agent holds the warning and
    sends it once rank 1 catches it), so it saves and ends while rank 0 still saves (2 s):
    neither the launcher nor srun's --kill-on-bad-exit may end rank 0 before it saved.
    Then a second run is stopped with `orchestrator stop`: cancelled, never submitted
    again."""
    (work / "ckpt").mkdir()
    race = ("--env=LATE_RANK=1", "--env=SLOW_RANK=0", "--env=SAVE_S=2")
    proc = _waiting_ranks(slurm_cluster, work, "pre", *race)
    try:
        job_id = job_id_in(combined(work, "pre"))
        urgent = slurm_cluster.sbatch(
            "#!/bin/bash\nsleep 5\n",
            f"--partition={URGENT_PARTITION}",
            "--exclusive",
            f"--nodes={len(slurm_cluster.nodes)}",
            "--output=/dev/null",
        )
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert slurm_cluster.wait_job(urgent)["JobState"] == "COMPLETED"
    assert f"SLURM job {job_id}: SIGUSR1 to every rank for a preemption" in out
    status = status_of(work, "pre")
    again = status["slurm_job_id"]
    assert (
        f"SLURM job {again} submitted, after job {job_id} preempted by a higher-priority job" in out
    )
    assert "rank 1 was still starting when SIGUSR1 came: sent it now that it catches it" in out
    for rank in (0, 1):
        got = out.index(f" r{rank}] rank {rank} got SIGUSR1 in job {job_id}")
        resumed = f" r{rank}] rank {rank} resumed from checkpoint {rank} (job {again}, restart 0)"
        assert out.index(resumed) > got, out
    # Rank 1 ended first; nothing stopped rank 0 while it saved.
    assert out.index(" r1] rank 1 got SIGUSR1") < out.index(" r0] rank 0 got SIGUSR1"), out
    assert "stopping the run on every node" not in out and "Terminated" not in out, out
    assert [(s["job_id"], s["ended"], s["next"]) for s in status["attempts"]] == [
        (job_id, "preempted", f"resubmitted as job {again}"),
        (again, "completed", None),
    ], status["attempts"]
    assert status["attempts"][0]["warning"] == "SIGUSR1 for a preemption"
    assert (status["state"], status["exit_code"]) == ("succeeded", 0)
    assert_gone(slurm_cluster, again, "pre")

    for path in (work / "ckpt").iterdir():
        path.unlink()
    proc = _waiting_ranks(slurm_cluster, work, "gone")
    try:
        job_id = job_id_in(combined(work, "gone"))
        stopped = orchestrator(slurm_cluster, work, "stop", "gone", "--run-dir", str(work / "runs"))
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert proc.returncode != 0 and "submitted, after job" not in out, out
    status = status_of(work, "gone")
    assert status["state"] == "stopped", status
    assert [(s["job_id"], s["ended"], s["next"]) for s in status["attempts"]] == [
        (job_id, "cancelled", None)
    ]
    assert status["slurm_job_id"] == job_id and "slurm_job_ids" not in status
    assert_gone(slurm_cluster, job_id, "gone")
