"""Split invariance and exact resume, through the real CLI and real torchrun/gloo.

Each run writes DIR/final.pt; runs that should train the same model are compared
parameter by parameter.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from orchestrator.trainer.checkpoint import load_checkpoint
from orchestrator.trainer.config import LAUNCH_WORLD_SIZE_ENV, TrainConfig
from orchestrator.trainer.datasets import make_synthetic
from orchestrator.trainer.models import build_model
from tests.trainer_helpers import (
    FAST,
    load_weights,
    max_abs_difference,
    run_torchrun,
    run_trainer,
    start_ranks,
    trainer_env,
    wait_all,
)

STEPS = ["--max-steps", "20"]
# Every run on the CPU, whatever the machine has: on one GPU a single process would train
# on it while two ranks fall back to CPU, and the comparison would measure the devices'
# float differences instead of the split's.
ON_CPU = [*FAST, "--device", "cpu"]
# Splits into other blocks (another --batch-size) sum other float32 products: the same
# model to rounding. Splits of the same blocks (any world x accumulation with the same
# --batch-size and global batch) give it bit for bit (split.py, gradients.py).
SPLIT_TOLERANCE = 1e-5
RESUME_TOLERANCE = 1e-6
# A run launched on 4 ranks x batch 2 (global batch 8, 64 steps an epoch) that lost a rank
# after step 10 and went on with 3, then grew back to 4 after step 15. Every step still
# sums the launch's four blocks of 2 (the 3 ranks take 2, 1 and 1 of them), exactly, so
# the weights are the uninterrupted run's at every checkpoint, bit for bit.
ELASTIC = [*ON_CPU, "--batch-size", "2", "--max-steps", "20", "--checkpoint-every", "5",
           "--keep-checkpoints", "0", "--log-every", "5"]  # fmt: skip


def _train(tmp: Path, name: str, args: list[str], *, nproc: int = 0) -> dict[str, torch.Tensor]:
    out = tmp / name
    argv = [*ON_CPU, *args, "--checkpoint-dir", str(out)]
    result = run_torchrun(nproc, argv) if nproc else run_trainer(argv)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return load_weights(out / "final.pt")


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchrun, 2 ranks x batch 4 x accum 1 (global batch 8), 20 steps, checkpoint at 10."""
    out = tmp_path_factory.mktemp("reference") / "run"
    result = run_torchrun(
        2, [*ON_CPU, *STEPS, "--batch-size", "4", "--checkpoint-every", "10",
            "--checkpoint-dir", str(out), "--metrics", str(out / "metrics-{rank}.jsonl")],
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def _initial_weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(TrainConfig().seed)
    data = make_synthetic(16, images=False, seed=TrainConfig().seed)
    return build_model("mlp", data.sample_shape, data.num_classes).state_dict()


def test_two_ranks_equal_one_rank_with_accumulation(reference_run: Path, tmp_path: Path) -> None:
    ddp = load_weights(reference_run / "final.pt")
    accumulated = _train(tmp_path, "w1a2", [*STEPS, "--batch-size", "4", "--grad-accum", "2"])
    assert max_abs_difference(ddp, accumulated) == 0.0  # the same blocks of 4
    # Not vacuous: 20 steps really moved the weights, and the plain state_dict has no
    # DDP "module." prefix.
    assert max_abs_difference(ddp, _initial_weights()) > 1e-3
    assert not any(key.startswith("module.") for key in ddp)


def test_each_rank_writes_its_own_metrics(reference_run: Path) -> None:
    ranks = [
        [json.loads(line) for line in (reference_run / f"metrics-{r}.jsonl").open()] for r in (0, 1)
    ]
    assert [rec["step"] for rec in ranks[0]] == [rec["step"] for rec in ranks[1]] == [
        2, 4, 6, 8, 10, 12, 14, 16, 18, 20
    ]  # fmt: skip
    for rec0, rec1 in zip(*ranks, strict=True):
        assert (rec0["rank"], rec1["rank"], rec0["world_size"]) == (0, 1, 2)
        # The global loss is shared; each rank's own loss is over its own samples.
        assert rec0["loss"] == rec1["loss"]
        assert rec0["loss"] == pytest.approx((rec0["rank_loss"] + rec1["rank_loss"]) / 2)
        assert rec0["step_time_s"] > 0 and 0 <= rec0["data_wait_share"] < 1


def test_ranks_times_accumulation_equals_one_big_batch(reference_run: Path, tmp_path: Path) -> None:
    # 2 ranks (joined by --init-method file://, no torchrun) x batch 4 x accum 2 ...
    procs = start_ranks(
        2, [*ON_CPU, *STEPS, "--batch-size", "4", "--grad-accum", "2",
            "--checkpoint-dir", str(tmp_path / "w2b4a2")],
        tmp_path / "rendezvous", tmp_path / "logs",
    )  # fmt: skip
    assert wait_all(procs, timeout=120) == [0, 0], (tmp_path / "logs" / "rank0.err").read_text()
    split = load_weights(tmp_path / "w2b4a2" / "final.pt")
    # ... against 1 process x batch 16: both average each step over the same 16 samples.
    whole = _train(tmp_path, "w1b16", [*STEPS, "--batch-size", "16"])
    assert max_abs_difference(split, whole) <= SPLIT_TOLERANCE
    # A different global batch (8 in the reference run) must give a different model,
    # which shows the comparison above can fail.
    assert max_abs_difference(split, load_weights(reference_run / "final.pt")) > 1e-3


def test_resume_from_step_10_equals_straight_run_to_20(reference_run: Path, tmp_path: Path) -> None:
    first = tmp_path / "resumed"
    args = [*ON_CPU, "--batch-size", "4", "--checkpoint-dir", str(first)]
    result = run_torchrun(2, [*args, "--max-steps", "10"])
    assert result.returncode == 0, result.stdout + result.stderr
    state = load_checkpoint(first / "ckpt-00000010.pt")
    assert (state["step"], state["epoch"], state["step_in_epoch"]) == (10, 0, 10)
    assert len(state["rng"]) == 2  # one RNG snapshot per rank
    assert state["optimizer"]["state"], "momentum buffers must be saved"

    result = run_torchrun(2, [*args, "--max-steps", "20", "--resume"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "resumed from" in result.stdout and "at step 10" in result.stdout
    resumed = load_weights(first / "final.pt")
    straight = load_weights(reference_run / "final.pt")
    assert max_abs_difference(resumed, straight) <= RESUME_TOLERANCE
    # The checkpoint at step 10 itself is not the answer: resuming did train 10 more steps.
    assert max_abs_difference(state["model"], straight) > 1e-4


def test_resume_into_a_different_split_of_the_same_global_batch(
    reference_run: Path, tmp_path: Path
) -> None:
    # The reference's step-10 checkpoint (2 ranks x 4) continued by 1 process x 4 x accum 2.
    directory = tmp_path / "continued"
    directory.mkdir()
    shutil.copy(reference_run / "ckpt-00000010.pt", directory)
    result = run_trainer(
        [*ON_CPU, *STEPS, "--batch-size", "4", "--grad-accum", "2", "--checkpoint-dir",
         str(directory), "--resume", str(directory / "ckpt-00000010.pt")],
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    continued = load_weights(directory / "final.pt")
    assert max_abs_difference(continued, load_weights(reference_run / "final.pt")) == 0.0
    # By hand, --global-batch keeps it where it does not divide: 1 process taking the 8
    # samples in micro-batches of at most 3 (3, 3 and 2), other blocks, so to rounding.
    uneven = tmp_path / "uneven"
    result = run_trainer(
        [*ON_CPU, *STEPS, "--batch-size", "3", "--global-batch", "8", "--checkpoint-dir",
         str(uneven), "--resume", str(directory / "ckpt-00000010.pt")],
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "1 rank(s) x 3 micro-batch(es) of 2-3 per step = global batch 8 (--global-batch)"
        in result.stdout
    ), result.stdout
    by_hand = load_weights(uneven / "final.pt")
    assert max_abs_difference(by_hand, load_weights(reference_run / "final.pt")) <= (
        SPLIT_TOLERANCE
    )


def test_resume_refuses_a_different_global_batch(reference_run: Path, tmp_path: Path) -> None:
    checkpoint = reference_run / "ckpt-00000010.pt"
    result = run_trainer([*ON_CPU, *STEPS, "--batch-size", "16", "--resume", str(checkpoint)])
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "checkpoint has global_batch=8 but this run has global_batch=16" in result.stderr
    assert "or --global-batch 8, is fine" in result.stderr


def _elastic_run(nproc: int, directory: Path, *args: str, launch: int | None = None) -> str:
    env = trainer_env(**({LAUNCH_WORLD_SIZE_ENV: str(launch)} if launch else {}))
    metrics = str(directory / "metrics-{rank}.jsonl")
    result = run_torchrun(
        nproc, [*ELASTIC, "--checkpoint-dir", str(directory), "--metrics", metrics, *args], env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def _metrics(directory: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (directory / f"metrics-{rank}.jsonl").open()]


def _resume_from(source: Path, step: int, directory: Path) -> None:
    directory.mkdir()
    shutil.copy(source / f"ckpt-{step:08d}.pt", directory)


def test_a_run_that_lost_a_rank_and_went_on_trains_the_same_model(tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    _elastic_run(4, straight)
    expected = load_weights(straight / "final.pt")

    # Lost a rank after step 10: 3 ranks take 4, 2 and 2 of each step's 8 samples
    # (micro-steps 2, 1 and 1: only the last of each rank all-reduces).
    shrunk = tmp_path / "shrunk"
    _resume_from(straight, 10, shrunk)
    out = _elastic_run(3, shrunk, "--resume", launch=4)
    assert (
        "3 rank(s) (launched with 4) x 1-2 micro-batch(es) of 2 per step = global batch 8 "
        "kept" in out
    ), out
    for step in (15, 20):
        name = f"ckpt-{step:08d}.pt"
        assert torch.equal(
            load_checkpoint(shrunk / name)["optimizer"]["state"][0]["momentum_buffer"],
            load_checkpoint(straight / name)["optimizer"]["state"][0]["momentum_buffer"],
        )
        assert (
            max_abs_difference(
                load_checkpoint(shrunk / name)["model"], load_checkpoint(straight / name)["model"]
            )
            == 0.0
        )
    shrunk_diff = max_abs_difference(load_weights(shrunk / "final.pt"), expected)
    assert shrunk_diff == 0.0
    # Not vacuous: the 10 steps after the checkpoint moved the weights far more.
    assert max_abs_difference(load_checkpoint(shrunk / "ckpt-00000010.pt")["model"], expected) > (
        1e-3
    )
    assert load_checkpoint(shrunk / "ckpt-00000015.pt")["split"]["world_size"] == 3

    # Reports count samples: the window losses are the straight run's (the same samples
    # through the same weights, to rounding), and the global loss is the ranks' own
    # losses weighted by their 4, 2 and 2 samples.
    ranks = [_metrics(shrunk, rank) for rank in range(3)]
    straight_lines = [rec for rec in _metrics(straight, 0) if rec["step"] > 10]
    assert [rec["step"] for rec in ranks[0]] == [rec["step"] for rec in straight_lines] == [15, 20]
    for rec, reference in zip(ranks[0], straight_lines, strict=True):
        assert rec["loss"] == pytest.approx(reference["loss"], abs=1e-5)
        assert rec["samples_per_s"] > 0
    for recs in zip(*ranks, strict=True):
        weighted = sum(n * rec["rank_loss"] for n, rec in zip((4, 2, 2), recs, strict=True))
        assert recs[0]["loss"] == pytest.approx(weighted / 8, rel=1e-6)
        assert len({rec["rank_loss"] for rec in recs}) == 3  # each rank its own samples

    # Grew back to 4 after step 15: the launch's own split again.
    grown = tmp_path / "grown"
    _resume_from(shrunk, 15, grown)
    out = _elastic_run(4, grown, "--resume", launch=4)
    assert "4 rank(s) x batch 2 x accum 1 = global batch 8;" in out, out
    grown_diff = max_abs_difference(load_weights(grown / "final.pt"), expected)
    assert grown_diff == 0.0
    print(f"max abs diff vs the straight run: 4->3 {shrunk_diff:.3g}, 4->3->4 {grown_diff:.3g}")
