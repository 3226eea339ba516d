"""A SLURM run outlives its controller, and `orchestrator attach RUN` takes it over: on the
lab's SLURM, a 2-node job whose ranks print numbered lines; its detached controller is
killed (SIGKILL: nothing of it runs on) while they print; the job goes on; `attach`
follows it to its end (exit 0, the run `succeeded`), answers `stacks` meanwhile, and every
rank's log holds every line exactly once, in order, though the old controller died
between reading and recording them. Only one controller at a time: attach refuses a run
whose controller lives, and a run that has ended."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

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

JOB = Path(__file__).resolve().parents[1] / "data" / "counting_job.py"
COUNT = 400  # lines per rank, one every 50 ms: 20 s of output


def counts(text: str, rank: int) -> list[int]:
    return [int(i) for i in re.findall(rf"^.*rank {rank} count (\d+)$", text, re.MULTILINE)]


def test_attach_takes_over_a_run_whose_controller_died(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    runs = str(work / "runs")
    args = launch_args(
        work, "over", "--nodes", "2", "--nproc-per-node", "1", "--partition", "debug",
        "--env", f"COUNT={COUNT}", "--detach", "--", str(JOB),
    )  # fmt: skip
    started = orchestrator(slurm_cluster, work, *args, timeout=60)
    assert started.returncode == 0, started.stdout + started.stderr
    job_id = job_id_in(started.stdout)
    wait_for(lambda: len(counts(combined(work, "over"), 1)) >= 40, 120, "rank 1's lines")
    refused = orchestrator(slurm_cluster, work, "attach", "over", "--run-dir", runs)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "is followed by its controller (pid" in refused.stderr
    controller = status_of(work, "over")["controller"]["pid"]
    os.kill(controller, signal.SIGKILL)
    killed_at = len(counts(combined(work, "over"), 1))
    time.sleep(3)  # the ranks print on; nobody reads
    assert slurm_cluster.run(["squeue", "-h", "-j", str(job_id)]).stdout.strip(), "job ended"
    attach = subprocess.Popen(
        command("attach", "over", "--run-dir", runs, "--color", "never"),
        cwd=work,
        env=slurm_cluster.environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: "attached to SLURM job" in combined(work, "over"), 30, "attach")
        shown = orchestrator(slurm_cluster, work, "stacks", "over", "--run-dir", runs, timeout=60)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "main thread in <module> (counting_job.py:" in shown.stdout, shown.stdout
        out, _ = attach.communicate(timeout=120)
    finally:
        if attach.poll() is None:
            attach.kill()
    print(out)
    assert attach.returncode == 0, out
    assert f"attached to SLURM job {job_id} (its controller, pid {controller}" in out
    assert killed_at < COUNT / 2, "the controller was killed while the ranks printed"
    logs = work / "runs" / "over" / "logs"
    for rank in (0, 1):
        own = (logs / f"rank-{rank}.log").read_text()
        assert counts(own, rank) == list(range(COUNT)), f"rank {rank}'s log"
        assert counts(combined(work, "over"), rank) == list(range(COUNT)), "combined.log"
    status = status_of(work, "over")
    assert status["state"] == "succeeded" and status["exit_code"] == 0, status
    again = orchestrator(slurm_cluster, work, "attach", "over", "--run-dir", runs)
    assert again.returncode == 2 and "has ended (succeeded)" in again.stderr, again.stderr
    assert_gone(slurm_cluster, job_id, "over")
