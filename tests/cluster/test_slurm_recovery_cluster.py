"""`--backend slurm` recovering on a real SLURM cluster: the time-limit signal with a
checkpoint and a requeue, and torchrun's --max-restarts (launched, and submitted by hand).

Every test drives the CLI as a user would and ends by checking that SLURM no longer lists
the job and that no process of the run (ORCHESTRATOR_RUN_ID=<run id>) is left on any node.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.lab.slurm import SlurmCluster
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
from tests.trainer_helpers import (
    CRASH_ONCE,
    CRASH_ONCE_ARGS,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slurm]


def test_rendered_script_with_restarts_submitted_by_hand(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    """`render --backend slurm --max-restarts 1`: the c10d rendezvous across the allocation,
    a rank that crashes once, torchrun restarting both nodes' workers, the job completing."""
    done = orchestrator(
        slurm_cluster,
        work,
        "render",
        "--backend",
        "slurm",
        "--nodes",
        "2",
        "--max-restarts",
        "1",
        "--env",
        "CRASH_ONCE_RANK=1",
        "-o",
        "out",
        "--run-id",
        "byhand-restarts",
        "--",
        "all_reduce.py",
    )
    assert done.returncode == 0, done.stderr
    job_id = slurm_cluster.sbatch(work / "out" / "job.sbatch", cwd=work)
    info = slurm_cluster.wait_job(job_id, timeout=150)
    output = (work / f"slurm-{job_id}.out").read_text()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), output
    assert output.count("rank 1 crashes once") == 1, output
    after = output.split("rank 1 crashes once")[1]
    nodes = re.findall(r"rank (\d)/2 on (\S+): all_reduce 3 expected 3", after)
    assert sorted(rank for rank, _ in nodes) == ["0", "1"], output  # both ran again
    assert len({node for _, node in nodes}) == 2, output
    assert_gone(slurm_cluster, job_id, "byhand-restarts")


def _requeued_job(work: Path, run_id: str) -> int:
    """Wait for the job's requeue; its id. (SLURM then holds it back for the lab's
    cred_expire, 20 s, before it starts again.)"""
    wait_for(lambda: "requeued" in combined(work, run_id), 150, "the requeue")
    return job_id_in(combined(work, run_id))


def test_a_program_of_its_own_is_warned_before_the_limit_and_goes_on_in_a_new_job(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    """--time 1 and nothing else: SLURM sends SIGUSR1 15 s before the one-minute limit (the
    default warning; up to 30 s earlier, at its next periodic check), every rank of a
    program of the user's own saves and exits 138, and `launch` submits the job again;
    the ranks resume and the run succeeds."""
    (work / "ckpt").mkdir()
    done = orchestrator(
        slurm_cluster,
        work,
        *launch_args(work, "sig", "--nodes", "2", "--time", "1", "--", "checkpointing.py", "ckpt"),
        timeout=240,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    first = job_id_in(out)
    assert "SIGUSR1 from SLURM (time limit near, or preempted): passing it to the ranks" in out
    assert f"SLURM job {first}: SIGUSR1 to every rank for the time limit" in out
    second = int(re.search(r"attempt 2: SLURM job (\d+) submitted, after job", out).group(1))
    for rank in (0, 1):
        got = out.index(f" r{rank}] rank {rank} got SIGUSR1 in job {first}")
        resumed = f" r{rank}] rank {rank} resumed from checkpoint {rank} (job {second}, restart 0)"
        assert out.index(resumed) > got, out
    status = status_of(work, "sig")
    assert (status["state"], status["slurm_job_id"], status["slurm_state"]) == (
        "succeeded",
        second,
        "COMPLETED",
    )
    attempts = status["attempts"]
    assert [(s["job_id"], s["ended"], s["next"]) for s in attempts] == [
        (first, "time-limit", f"resubmitted as job {second}"),
        (second, "completed", None),
    ], attempts
    assert attempts[0]["warning"] == "SIGUSR1 for the time limit"
    assert_gone(slurm_cluster, second, "sig")


def test_bundled_trainer_checkpoints_on_the_signal_and_resumes(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    """The documented recipe: --signal USR1@N --requeue, trainer --checkpoint-dir D --resume.
    SLURM's warning is sent here at once, as SLURM sends it (to the batch shell)."""
    proc = subprocess.Popen(
        command(
            *launch_args(
                work,
                "train",
                "--nodes",
                "2",
                "--signal",
                "USR1@300",
                "--requeue",
                "--",
                "-m",
                "orchestrator.trainer",
                "--checkpoint-dir",
                "ckpt",
                "--resume",
                "--epochs",
                "1000",
                "--log-every",
                "1",
            )
        ),
        cwd=work,
        env=slurm_cluster.environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: re.search(r"r0\] step \d+/", combined(work, "train")), 150, "training")
        job_id = job_id_in(combined(work, "train"))
        slurm_cluster.run(["scancel", "--batch", "--signal=USR1", str(job_id)])
        _requeued_job(work, "train")
        wait_for(lambda: "resumed from" in combined(work, "train"), 150, "the resumed trainer")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    resumed = re.search(r"r0\] resumed from (\S+) at step (\d+)", out)
    assert resumed and int(resumed.group(2)) > 0, out
    assert (work / resumed.group(1)).is_file()
    assert proc.returncode == 130 and status_of(work, "train")["slurm_restarts"] == 1
    assert_gone(slurm_cluster, job_id, "train")


def test_a_rank_crashing_once_restarts_and_resumes_to_the_same_model(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    """--max-restarts 1 through the sbatch script's c10d rendezvous: rank 1 crashes once after
    the first checkpoint, torchrun restarts the workers on both nodes, the job goes on, the
    trainer resumes and ends with the model of an uninterrupted run (2 local ranks: the same
    world size, quicker than a second SLURM job)."""
    trainer = ["--", str(CRASH_ONCE), *CRASH_ONCE_ARGS, "--synthetic-samples", "1024"]
    done = orchestrator(
        slurm_cluster,
        work,
        *launch_args(
            work,
            "restart",
            "--nodes",
            "2",
            "--max-restarts",
            "1",
            "--env=CRASH_ONCE_RANK=1",
            "--env=OMP_NUM_THREADS=1",
            *trainer,
            "--checkpoint-dir",
            "ckpt-restart",
        ),
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    job_id = job_id_in(done.stdout)
    status = status_of(work, "restart")
    host = status["nodes"][1]["host"]
    assert (
        f"rank 1 on {host} failed with exit code 3; torchrun restarts the workers "
        "(--max-restarts 1 per node)" in out
    )
    assert re.search(
        rf"restarted 1 time\(s\) \(--max-restarts 1\):\n.*restart 1: rank 1 on "
        rf"{host} ended with exit code 3 after [\d.]+ s\n.*run restart succeeded",
        out,
    ), out
    assert (status["state"], status["slurm_state"], status["restarts"]) == (
        "succeeded",
        "COMPLETED",
        1,
    ), status
    assert status["restart_causes"][0].startswith(
        f"restart 1: rank 1 on {host} ended with exit code 3"
    ), status
    assert [r["state"] for r in status["ranks"]] == ["succeeded"] * 2
    logs = work / "runs" / "restart" / "logs"
    rank1 = (logs / "rank-1.log").read_text()
    assert "rank 1 crashing once (attempt 0)" in rank1
    assert rank1.split("crashing once")[1].count("rank 1/2 started") == 1, rank1  # again
    rank0 = (logs / "rank-0.log").read_text()  # rank 0 reports the trainer's progress
    assert re.search(r"resumed from ckpt-restart/ckpt-\d+\.pt at step [1-9]", rank0), rank0
    assert_gone(slurm_cluster, job_id, "restart")

    assert_model_of_an_uninterrupted_run(slurm_cluster, work, "ckpt-restart", trainer)
