"""Running the real trainer CLI from tests: alone, under torchrun, or as N explicit ranks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from tests.factories import wait_for as wait_for  # the trainer tests take it from here

PYTHON = sys.executable
TRAINER = [PYTHON, "-m", "orchestrator.trainer"]
# Small and quick: 512 synthetic samples, tiny per-rank batches.
FAST = ["--synthetic-samples", "512", "--no-eval"]

# The --max-restarts tests: the trainer with one rank that crashes once (CRASH_ONCE_RANK)
# after the first checkpoint; about 85 steps per epoch on 3 ranks, 128 on 2, so the crash
# comes well before the end.
CRASH_ONCE = Path(__file__).resolve().parent / "data" / "crash_once.py"
CRASH_ONCE_ARGS = [
    "--synthetic-samples",
    "2048",
    "--batch-size",
    "8",
    "--epochs",
    "2",
    "--no-eval",
    "--checkpoint-every",
    "10",
    "--log-every",
    "20",
    "--resume",
]
# As in test_trainer_equivalence: a resumed run matches a straight one to float rounding
# (here the two runs also rendezvous differently: c10d with restarts, static without).
RESUME_TOLERANCE = 1e-6


def trainer_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # Two processes share two cores here; one thread each keeps runs quick and
    # the float summation order of a given split stable.
    env["OMP_NUM_THREADS"] = "1"
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    # Set only where a test means it: a run that went on with fewer ranks.
    env.pop("ORCHESTRATOR_LAUNCH_WORLD_SIZE", None)
    env.update(extra)
    return env


def run_trainer(
    args: Sequence[str], *, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """One plain process (world size 1, no process group)."""
    return subprocess.run(
        [*TRAINER, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or trainer_env(),
    )


def torchrun_command(nproc: int, args: Sequence[str], *torchrun_args: str) -> list[str]:
    return [
        PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        *torchrun_args, "-m", "orchestrator.trainer", *args,
    ]  # fmt: skip


def run_torchrun(
    nproc: int,
    args: Sequence[str],
    *torchrun_args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Real torchrun, picking its own free port (--standalone)."""
    return subprocess.run(
        torchrun_command(nproc, args, *torchrun_args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or trainer_env(),
    )


def start_ranks(
    world_size: int, args: Sequence[str], rendezvous: Path, logs: Path
) -> list[subprocess.Popen[str]]:
    """World_size trainer processes joined with --init-method file://, without torchrun.

    Output goes to logs/rank{r}.out and .err (files, not pipes, so nothing blocks).
    """
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(world_size):
        cmd = [
            *TRAINER, *args, "--init-method", f"file://{rendezvous}",
            "--rank", str(rank), "--world-size", str(world_size),
        ]  # fmt: skip
        with (
            (logs / f"rank{rank}.out").open("w") as out,
            (logs / f"rank{rank}.err").open("w") as err,
        ):
            procs.append(
                subprocess.Popen(cmd, stdout=out, stderr=err, env=trainer_env(), text=True)
            )
    return procs


def wait_all(procs: Sequence[subprocess.Popen[str]], timeout: float) -> list[int]:
    """Exit codes of all processes; kills them all and fails if any outlives ``timeout``."""
    deadline = time.monotonic() + timeout
    codes = []
    try:
        for proc in procs:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        raise AssertionError(f"trainer processes still running after {timeout} s (hang)") from None
    return codes


def kill_group(proc: subprocess.Popen[str], sig: signal.Signals = signal.SIGKILL) -> None:
    """Signal the process group of a process started with start_new_session=True."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


def max_abs_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def assert_clean_failure(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit code 2, a one-line message naming the option and value, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
