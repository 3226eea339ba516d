"""The trainer on a CUDA machine: device choice, NCCL, bf16, and peers on NCCL.

Marked `cuda`: they run wherever torch sees a GPU and skip elsewhere, saying why. They are
written for any GPU count, a machine with fewer GPUs than ranks included: what they expect
follows from torch.cuda.device_count().
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.trainer_helpers import (
    FAST,
    TRAINER,
    run_torchrun,
    start_ranks,
    trainer_env,
    wait_all,
    wait_for,
)

pytestmark = pytest.mark.cuda

STEPS = ["--max-steps", "20", "--batch-size", "8"]


def _gpus() -> int:
    return torch.cuda.device_count()


def test_one_rank_trains_on_cuda_0_with_nccl_in_bf16() -> None:
    result = run_torchrun(1, [*FAST, *STEPS, "--precision", "bf16"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"rank 0/1 started: pid \d+, cuda:0 \(of \d+ visible", result.stdout)
    assert ", nccl, " in result.stdout and "done: 20 steps" in result.stdout


def test_cuda_visible_devices_is_respected(tmp_path: Path) -> None:
    env = trainer_env(CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [*TRAINER, *FAST, *STEPS], capture_output=True,
        text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "cpu (0 GPU(s) visible)" in result.stdout


def test_init_method_ranks_use_a_gpu_each_or_all_fall_back_to_cpu(tmp_path: Path) -> None:
    # Two ranks by hand on this one node: they derive local ranks 0 and 1 from their
    # shared host name; with fewer than 2 GPUs both choose CPU (one NCCL, one gloo rank
    # would never meet), else cuda:0 and cuda:1.
    logs = tmp_path / "logs"
    procs = start_ranks(2, [*FAST, *STEPS], tmp_path / "rdzv", logs)
    assert wait_all(procs, timeout=180) == [0, 0], (logs / "rank0.err").read_text()
    for rank in (0, 1):
        out = (logs / f"rank{rank}.out").read_text()
        expected = f"cuda:{rank} (of" if _gpus() >= 2 else "cpu ("
        assert f"rank {rank}/2 started: pid" in out and expected in out, out
    if _gpus() < 2:
        assert "--device auto chose cpu" in (logs / "rank0.out").read_text()


def test_nccl_survivor_exits_when_its_peer_is_killed(tmp_path: Path) -> None:
    if _gpus() < 2:
        pytest.skip(f"needs 2 GPUs for 2 NCCL ranks; {_gpus()} visible")
    logs = tmp_path / "logs"
    procs = start_ranks(2, [*FAST, "--epochs", "100000", "--log-every", "10",
                            "--timeout", "20"], tmp_path / "rdzv", logs)  # fmt: skip
    try:
        wait_for(lambda: "step 20/" in (logs / "rank0.out").read_text(), 120, "training")
        procs[1].send_signal(signal.SIGKILL)
        code = procs[0].wait(timeout=20 + 30)
    finally:
        for proc in procs:
            proc.kill()
    assert code != 0


def _final_loss(output: str) -> float:
    match = re.search(r"done: \d+ steps, final loss ([\d.]+)", output)
    assert match is not None, output
    return float(match.group(1))


def test_the_step_replayed_as_cuda_graphs_trains_like_the_eager_step() -> None:
    # fp32 and a fixed seed: the graphs replay the very kernels the eager step launches,
    # so both runs must end at the same loss (up to cuDNN's choice of algorithm).
    args = [*FAST, *STEPS, "--model", "cnn", "--log-every", "5"]
    graphed = run_torchrun(1, args)
    eager = run_torchrun(1, [*args, "--no-cuda-graphs"])
    assert graphed.returncode == 0, graphed.stdout + graphed.stderr
    assert eager.returncode == 0, eager.stdout + eager.stderr
    assert "fp32, CUDA graphs" in graphed.stdout and "CUDA graphs" not in eager.stdout
    assert abs(_final_loss(graphed.stdout) - _final_loss(eager.stdout)) < 1e-3


def test_accumulating_micro_steps_are_not_graphed() -> None:
    # A graph's reused gradient buffer would be added to itself across micro-steps.
    result = run_torchrun(1, [*FAST, *STEPS, "--grad-accum", "2"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "accum 2" in result.stdout and "CUDA graphs" not in result.stdout
