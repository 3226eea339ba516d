"""Under SLURM the launcher sees inside the job as over SSH: the batch script runs the node
agent on every node (one srun task each), and the launcher reaches it through SLURM itself
(`srun --overlap`). On the lab's SLURM, a 2-node job whose ranks each run a thread printing
a line every 2 s, while rank 1's main thread is deadlocked (a lock taken twice) before the
all_reduce rank 0 waits in: `orchestrator stacks RUN` names rank 1 and its frame first, and
`--hang-timeout` ends the run `hung` (exit 1) within the timeout and 30 s, naming it, with
the job gone from squeue and no process of the run left on any node. The same job without
the deadlock (main threads working, the threads printing) is never stopped. A rank stuck on
its DataLoader worker is named as over SSH: the loop's line, and the worker's read in the
Dataset under it."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.supervise.hangs import LULL_S, SAMPLE_GAP_S
from tests.cluster.test_hangs_cluster import (
    LOADER,
    LOADER_HANG_TIMEOUT,
    check_loader_hung,
    check_loader_stacks,
)
from tests.lab.slurm import SlurmCluster
from tests.slurm_helpers import (  # noqa: F401 (fixtures, used by name)
    assert_gone,
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

JOB = Path(__file__).resolve().parents[1] / "data" / "printing_deadlock_job.py"
HANGS_ONCE = JOB.with_name("hangs_once.py")
SECOND_ACQUIRE = 1 + JOB.read_text().splitlines().index(
    "    lock.acquire()  # not reentrant: never returns"
)
# --hang-timeout: a hang is found about HANG_TIMEOUT + 10 s after it begins (a due check
# waits up to LULL_S for a pause in the printing, then SAMPLE_GAP_S to its second sample);
# a check while the ranks still start sees them move (or not all there) and is no verdict,
# the next coming a timeout later, so the timeout need not outlast the start.
HANG_TIMEOUT = 5
# The working job's main threads work this long after "ready": a whole check counted from
# the last progress, which came before the work or in it, so a check is judged while they
# work, where a false hang verdict would fire (15 s; 30 s with the timeout of 20 it had).
WORK_S = HANG_TIMEOUT + LULL_S + SAMPLE_GAP_S
STUCK = f"main thread in take_the_lock_twice (printing_deadlock_job.py:{SECOND_ACQUIRE})"


def printing_job(work: Path, run_id: str, env: str, *more: str) -> list[str]:
    return launch_args(
        work, run_id, "--nodes", "2", "--nproc-per-node", "1", "--partition", "debug",
        "--hang-timeout", str(HANG_TIMEOUT), "--env", env, *more, "--", str(JOB),
    )  # fmt: skip


def test_stacks_and_a_hang_verdict_under_slurm(slurm_cluster: SlurmCluster, work: Path) -> None:
    runs = str(work / "runs")
    launch = subprocess.Popen(
        command(*printing_job(work, "hang", "DEADLOCK_RANK=1")),
        cwd=work,
        env=slurm_cluster.environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: combined(work, "hang").count("ready") >= 2, 120, "both ranks ready")
        time.sleep(1)  # rank 0 reaches the all_reduce
        asked = time.monotonic()
        shown = orchestrator(slurm_cluster, work, "stacks", "hang", "--run-dir", runs, timeout=60)
        took = time.monotonic() - asked
        print(f"stacks in {took:.1f} s:\n{shown.stdout}")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        hosts = [node["host"] for node in status_of(work, "hang")["nodes"]]
        first = shown.stdout.splitlines()[0]
        assert first.startswith(f"[{hosts[1]} r1] 1 rank: {STUCK}"), shown.stdout
        assert f"[{hosts[0]} r0] 1 rank: main thread in all_reduce " in shown.stdout
        out, _ = launch.communicate(timeout=HANG_TIMEOUT + 120)
    finally:
        if launch.poll() is None:
            launch.kill()
    ended = time.time()
    print(out)
    assert launch.returncode == 1, out
    log = combined(work, "hang")
    readies = [float(t) for t in re.findall(r"\bready (\d+\.\d+)", log)]
    took = ended - max(readies)  # the deadlock came right after the last rank was ready
    print(f"ended hung {took:.0f} s after the deadlock")
    assert took <= HANG_TIMEOUT + 30, f"ended {took:.0f} s after the deadlock"
    assert log.count("memory") >= 6, "the printing threads printed"
    console = [line.removeprefix("[orchestrator] ") for line in out.splitlines()]
    at = next(i for i, line in enumerate(console) if line.startswith("hung: no new step"))
    assert console[at + 1].startswith(f"[{hosts[1]} r1] 1 rank: {STUCK}"), console[at:]
    status = status_of(work, "hang")
    assert status["state"] == "hung" and status["exit_code"] == 1, status
    assert status["hang"]["stuck_ranks"] == [1], status["hang"]
    assert "run hang hung (exit code 1)" in out
    assert_gone(slurm_cluster, job_id_in(out), "hang")


def test_ranks_that_print_and_work_under_slurm_are_never_stopped(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    job = printing_job(work, "works", f"WORK_S={WORK_S:g}")
    done = orchestrator(slurm_cluster, work, *job, timeout=240)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" s apart: working") == 1, done.stdout
    assert "hung" not in done.stdout and "cancelling" not in done.stdout
    assert combined(work, "works").count("worked") == 2
    assert status_of(work, "works")["state"] == "succeeded"
    assert_gone(slurm_cluster, job_id_in(done.stdout), "works")


def test_a_hang_under_max_restarts_restarts_the_workers_under_slurm(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    """--max-restarts 1: the hang is named, the stuck rank ended through its node's agent,
    torchrun starts the workers again on both nodes, and the second attempt (which does not
    hang) succeeds, as over SSH."""
    args = launch_args(
        work, "again", "--nodes", "2", "--nproc-per-node", "1", "--partition", "debug",
        "--hang-timeout", str(HANG_TIMEOUT), "--max-restarts", "1", "--", str(HANGS_ONCE),
    )  # fmt: skip
    done = orchestrator(slurm_cluster, work, *args, timeout=300)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "ending rank 1 so that torchrun restarts the workers (restart 1 of --max-restarts 1)"
        in done.stdout
    )
    assert combined(work, "again").count("] reduced 2.0") == 2  # both ranks, the 2nd attempt
    status = status_of(work, "again")
    assert status["state"] == "succeeded" and status["restarts"] == 1, status
    assert "hang" not in status  # restarted, not ended hung
    assert_gone(slurm_cluster, job_id_in(done.stdout), "again")


def test_a_rank_stuck_on_its_data_loader_under_slurm(slurm_cluster: SlurmCluster, work: Path):
    runs = str(work / "runs")
    args = launch_args(
        work, "loader", "--nodes", "2", "--nproc-per-node", "1", "--partition", "debug",
        "--hang-timeout", str(LOADER_HANG_TIMEOUT), "--env", "STUCK_RANK=1",
        "--", str(LOADER),
    )  # fmt: skip
    launch = subprocess.Popen(
        command(*args), cwd=work, env=slurm_cluster.environ(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: combined(work, "loader").count("ready") >= 2, 120, "both ranks ready")
        hosts = [node["host"] for node in status_of(work, "loader")["nodes"]]
        check_loader_stacks(
            lambda: orchestrator(
                slurm_cluster, work, "stacks", "loader", "--run-dir", runs, timeout=60
            ),
            hosts[1],
        )
        out, _ = launch.communicate(timeout=LOADER_HANG_TIMEOUT + 120)
    finally:
        if launch.poll() is None:
            launch.kill()
    print(out)
    assert launch.returncode == 1, out
    check_loader_hung(out, hosts[1])
    assert status_of(work, "loader")["hang"]["stuck_ranks"] == [1]
    assert_gone(slurm_cluster, job_id_in(out), "loader")
