"""Shared by the SLURM end-to-end tests: the jobs they run, the fixtures that give each test a
clean queue and a work folder, and the checks every test ends with (SLURM no longer lists the
job; no process of the run, ORCHESTRATOR_RUN_ID=<run id>, is left on any node).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests import factories
from tests.cli_helpers import REPO
from tests.lab.slurm import SlurmCluster
from tests.trainer_helpers import RESUME_TOLERANCE, load_weights, max_abs_difference

ALL_REDUCE = """\
import os
import torch
import torch.distributed as dist

if os.environ["RANK"] == os.environ.get("CRASH_ONCE_RANK") and \
        os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    print(f"rank {os.environ['RANK']} crashes once", flush=True)
    raise SystemExit(3)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
expected = world * (world + 1) / 2
print(f"rank {rank}/{world} on {os.environ['SLURMD_NODENAME']}: all_reduce {value.item():g} "
      f"expected {expected:g}", flush=True)
dist.destroy_process_group()
raise SystemExit(0 if value.item() == expected else 1)
"""
# No torch: fails (FAIL_RANK) or sleeps, quickly.
RANKS = """\
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} up on {os.environ['SLURMD_NODENAME']}", flush=True)
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    print(f"rank {rank} fails now", flush=True)
    sys.exit(3)
time.sleep(300)
"""
# Waits for SIGUSR1, saves a "checkpoint" and exits 128+SIGUSR1; in its next job (a
# requeue, or the job submitted again), resumes; a rank that finds a peer's checkpoint but
# not its own (it never saved) says so and fails at once instead of waiting for a signal.
# LATE_RANK=R: rank R installs its handler only once the job's warning file exists (a
# rank still importing its libraries when the warning came); SLOW_RANK=R: rank R takes
# SAVE_S seconds to save (a bigger shard than its peers').
CHECKPOINTING = """\
import os, signal, sys, time
from pathlib import Path
rank = int(os.environ["RANK"])
checkpoint = Path(sys.argv[1]) / f"rank-{rank}.ckpt"
if checkpoint.exists():
    print(f"rank {rank} resumed from {checkpoint.read_text()} (job "
          f"{os.environ['SLURM_JOB_ID']}, restart {os.environ.get('SLURM_RESTART_COUNT', 0)})",
          flush=True)
    raise SystemExit(0)
peers = sorted(p.name for p in Path(sys.argv[1]).glob("rank-*.ckpt"))
if peers:
    print(f"rank {rank} has no checkpoint, though its peers saved: {peers}", flush=True)
    raise SystemExit(3)
got = []
if os.environ.get("LATE_RANK") == str(rank):
    print(f"rank {rank} starting: its handler comes after the warning", flush=True)
    attempt = f"attempt{os.environ.get('SLURM_RESTART_COUNT', 0)}"
    warning = Path(os.environ["ORCHESTRATOR_JOB_DIR"]) / attempt / "warning"
    deadline = time.monotonic() + 60
    while not warning.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the warning has reached every process of the step by now
signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
print(f"rank {rank} waiting for SIGUSR1", flush=True)
while not got:
    time.sleep(0.05)
if os.environ.get("SLOW_RANK") == str(rank):
    time.sleep(float(os.environ.get("SAVE_S", "2")))
checkpoint.write_text(f"checkpoint {rank}")
print(f"rank {rank} got SIGUSR1 in job {os.environ['SLURM_JOB_ID']}", flush=True)
raise SystemExit(128 + signal.SIGUSR1)
"""


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(slurm_cluster: SlurmCluster) -> Iterator[None]:
    """A test that fails part-way must not leave its job queued or running for the next:
    cancel whatever this private cluster still holds, and let the nodes go idle."""
    yield
    left = slurm_cluster.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
    if left:
        slurm_cluster.run(["scancel", "--signal=KILL", *left], check=False)
        slurm_cluster.wait_idle(timeout=60)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    for name, text in (
        ("all_reduce.py", ALL_REDUCE),
        ("ranks.py", RANKS),
        ("checkpointing.py", CHECKPOINTING),
    ):
        (tmp_path / name).write_text(text)
    return tmp_path


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", *args]


def orchestrator(
    slurm: SlurmCluster,
    cwd: Path,
    *args: str,
    timeout: float = 180,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(*args),
        cwd=cwd,
        env=env or slurm.environ(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def launch_args(work: Path, run_id: str, *args: str) -> list[str]:
    return [
        "launch",
        "--backend",
        "slurm",
        "--run-dir",
        str(work / "runs"),
        "--run-id",
        run_id,
        "--color",
        "never",
        *args,
    ]


def job_id_in(output: str) -> int:
    match = re.search(r"SLURM job (\d+) submitted", output)
    assert match, output
    return int(match.group(1))


def status_of(work: Path, run_id: str) -> dict:
    return json.loads((work / "runs" / run_id / "status.json").read_text())


# The SLURM tests' conditions read the lab's files and ask its nodes: five times a second.
wait_for = partial(factories.wait_for, poll=0.2)


def combined(work: Path, run_id: str) -> str:
    path = work / "runs" / run_id / "logs" / "combined.log"
    return path.read_text(errors="replace") if path.exists() else ""


def assert_gone(slurm: SlurmCluster, job_id: int, run_id: str) -> None:
    """SLURM no longer lists the job and no process of the run is left on any node."""
    assert slurm.run(["squeue", "-h", "-j", str(job_id)]).stdout.strip() == ""
    deadline = time.monotonic() + 3
    while (
        left := slurm.cluster.processes_with_env("ORCHESTRATOR_RUN_ID", run_id)
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], [p.command for p in left]


def assert_model_of_an_uninterrupted_run(
    slurm: SlurmCluster, work: Path, checkpoint_dir: str, trainer: list[str], timeout: float = 180
) -> None:
    """The same trainer run again here without interruption (2 local ranks: the world size
    of 2 one-rank nodes, quicker than a SLURM job) ends with the weights in
    `checkpoint_dir`/final.pt, within RESUME_TOLERANCE. `trainer` starts with `--`."""
    plain = orchestrator(
        slurm,
        work,
        "launch",
        str(REPO / "hostfiles" / "local.txt"),
        "--run-dir",
        str(work / "runs"),
        "--run-id",
        "plain",
        "--env=OMP_NUM_THREADS=1",
        *trainer,
        "--checkpoint-dir",
        "ckpt-plain",
        timeout=timeout,
    )
    assert plain.returncode == 0, plain.stdout + plain.stderr
    difference = max_abs_difference(
        load_weights(work / checkpoint_dir / "final.pt"),
        load_weights(work / "ckpt-plain" / "final.pt"),
    )
    assert difference <= RESUME_TOLERANCE, difference
