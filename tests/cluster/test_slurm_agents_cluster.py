"""Under SLURM the launcher sees inside the job as over SSH: the batch script runs the node
agent on every node (one srun task each), and the launcher reaches it through SLURM itself
(`srun --overlap`). On the lab's SLURM, a 2-node job in which rank 1 never reaches the
all_reduce rank 0 waits in: `orchestrator stacks RUN` names rank 1 and its frame first, and
`--hang-timeout` ends the run `hung` (exit 1) naming it, with the job gone from squeue and
no process of the run left on any node."""

from __future__ import annotations

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

JOB = Path(__file__).resolve().parents[1] / "data" / "hang_job.py"
STUCK_LINE = JOB.read_text().splitlines().index("        time.sleep(0.5)") + 1
HANG_TIMEOUT = 30


def test_stacks_and_a_hang_verdict_under_slurm(slurm_cluster: SlurmCluster, work: Path) -> None:
    runs = str(work / "runs")
    args = launch_args(
        work, "hang", "--nodes", "2", "--nproc-per-node", "1", "--partition", "debug",
        "--hang-timeout", str(HANG_TIMEOUT), "--env", "STUCK_RANK=1", "--", str(JOB),
    )  # fmt: skip
    began = time.monotonic()
    launch = subprocess.Popen(
        command(*args),
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
        assert first.startswith(f"[{hosts[1]} r1] 1 rank: main thread in "), shown.stdout
        assert f"wait_for_a_batch_that_never_comes (hang_job.py:{STUCK_LINE})" in first
        assert "all_reduce" in shown.stdout.splitlines()[1], shown.stdout
        out, _ = launch.communicate(timeout=HANG_TIMEOUT + 120)
    finally:
        if launch.poll() is None:
            launch.kill()
    took = time.monotonic() - began
    print(out)
    print(f"the hung run ended after {took:.0f} s")
    assert launch.returncode == 1, out
    console = out.splitlines()
    at = next(i for i, line in enumerate(console) if "] hung: no rank printed" in line)
    assert console[at + 1].startswith(f"[orchestrator] [{hosts[1]} r1] 1 rank: main thread in ")
    status = status_of(work, "hang")
    assert status["state"] == "hung" and status["exit_code"] == 1, status
    assert status["hang"]["stuck_ranks"] == [1], status["hang"]
    assert "run hang hung (exit code 1)" in out
    assert_gone(slurm_cluster, job_id_in(out), "hang")
