"""Datasets (synthetic, CIFAR-10 pickles, .npz) and the split-invariant batch plan."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.trainer.batching import GlobalBatchPlan
from orchestrator.trainer.datasets import load_cifar10, load_npz, make_synthetic
from orchestrator.trainer.exits import TrainerUsageError
from orchestrator.trainer.split import BatchSplit
from tests.trainer_helpers import run_trainer


@settings(max_examples=60, deadline=None)
@given(
    samples=st.integers(8, 300),
    world=st.integers(1, 4),
    batch=st.integers(1, 6),
    accum=st.integers(1, 3),
    seed=st.integers(0, 2**32),
    step=st.integers(0, 50),
)
def test_every_split_covers_exactly_the_global_batch(
    samples: int, world: int, batch: int, accum: int, seed: int, step: int
) -> None:
    global_batch = world * batch * accum
    if global_batch > samples:
        with pytest.raises(TrainerUsageError, match="exceeds"):
            GlobalBatchPlan(samples, global_batch, seed)
        return
    plan = GlobalBatchPlan(samples, global_batch, seed)
    indices = plan.global_indices(step)
    # The trainer's own split (split.py): rank r's micro-step slices of the step's indices.
    split = BatchSplit(global_batch, world, batch)
    shares = [
        indices[part.start : part.start + part.count]
        for rank in range(world)
        for part in split.micro_batches(rank)
    ]
    assert len(shares) == world * accum
    assert all(len(share) == batch for share in shares)
    assert sorted(torch.cat(shares).tolist()) == sorted(indices.tolist())
    # The global batch itself depends only on (seed, global batch size, step):
    # a different split of the same size, on a fresh plan, picks the same samples.
    other = GlobalBatchPlan(samples, global_batch, seed)
    assert torch.equal(other.global_indices(step), indices)


def test_epochs_cover_distinct_samples_and_reshuffle() -> None:
    plan = GlobalBatchPlan(num_samples=100, global_batch=16, seed=7)
    assert plan.steps_per_epoch == 6  # 96 samples used, 4 dropped per epoch
    epoch0 = torch.cat([plan.global_indices(s) for s in range(6)])
    assert len(set(epoch0.tolist())) == 96
    epoch1 = torch.cat([plan.global_indices(s) for s in range(6, 12)])
    assert not torch.equal(epoch0, epoch1)
    assert plan.position(13) == (2, 1)
    assert not torch.equal(
        GlobalBatchPlan(100, 16, seed=8).global_indices(0), plan.global_indices(0)
    )


def test_synthetic_data_is_a_function_of_the_seed() -> None:
    a, b = make_synthetic(64, images=False, seed=3), make_synthetic(64, images=False, seed=3)
    assert torch.equal(a.train.inputs, b.train.inputs) and torch.equal(
        a.train.labels, b.train.labels
    )
    assert a.sample_shape == (64,) and a.num_classes == 10 and a.test is not None
    images = make_synthetic(8, images=True, seed=3)
    assert images.sample_shape == (3, 32, 32)
    assert not torch.equal(make_synthetic(64, images=False, seed=4).train.inputs, a.train.inputs)


def _write_cifar(directory: Path, per_batch: int = 8, rng_seed: int = 0) -> None:
    """Five data batches and a test batch in the cifar-10-batches-py pickle layout."""
    rng = np.random.default_rng(rng_seed)
    directory.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"labels": rng.integers(0, 10, per_batch).tolist(),
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"filenames": [f"{i}.png".encode() for i in range(per_batch)],
        }
        with (directory / name).open("wb") as f:
            pickle.dump(batch, f)


def test_cifar10_loader_reads_the_python_pickle_batches(tmp_path: Path) -> None:
    _write_cifar(tmp_path / "cifar-10-batches-py")
    with (tmp_path / "cifar-10-batches-py" / "data_batch_1").open("rb") as f:
        first = pickle.load(f)
    data = load_cifar10(tmp_path)  # the parent directory works too
    assert data.train.inputs.shape == (40, 3, 32, 32) and data.train.inputs.dtype == torch.uint8
    assert data.test is not None and len(data.test) == 8
    assert data.train.labels[:8].tolist() == first[b"labels"]
    # Channel-major rows: the first 1024 bytes of a row are the red plane.
    assert data.train.inputs[0, 0].flatten().tolist() == first[b"data"][0, :1024].tolist()
    assert data.train.inputs[0, 2, 31, 31] == first[b"data"][0, 3071]


def test_cifar10_loader_rejects_bad_directories_and_foreign_pickles(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainerUsageError, match="no data_batch_1..5"):
        load_cifar10(tmp_path / "empty")
    evil = tmp_path / "evil"
    evil.mkdir()
    with (evil / "data_batch_1").open("wb") as f:
        pickle.dump({b"data": os.getcwd, b"labels": []}, f)  # would call a function
    with pytest.raises(TrainerUsageError, match="not a CIFAR-10 python batch"):
        load_cifar10(evil)


def test_npz_loader_and_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    x = np.arange(24, dtype=np.float64).reshape(6, 4)
    np.savez(path, x=x, y=np.array([0, 1, 2, 0, 1, 2]), x_test=x[:2], y_test=np.array([2, 0]))
    data = load_npz(path)
    assert data.train.inputs.dtype == torch.float32 and data.sample_shape == (4,)
    assert data.num_classes == 3 and data.test is not None and len(data.test) == 2
    np.savez(tmp_path / "keys.npz", inputs=x, labels=np.zeros(6, dtype=np.int64))
    with pytest.raises(
        TrainerUsageError, match=r"has arrays \['inputs', 'labels'\]; expected x, y"
    ):
        load_npz(tmp_path / "keys.npz")
    np.savez(tmp_path / "short.npz", x=x, y=np.zeros(5, dtype=np.int64))
    with pytest.raises(TrainerUsageError, match="one label per row"):
        load_npz(tmp_path / "short.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(TrainerUsageError, match="cannot read as .npz"):
        load_npz(tmp_path / "junk.npz")


def test_cnn_trains_on_a_cifar_directory_end_to_end(tmp_path: Path) -> None:
    _write_cifar(tmp_path / "cifar", per_batch=16)
    metrics = tmp_path / "metrics-{rank}.jsonl"
    result = run_trainer(
        ["--model", "cnn", "--dataset", "cifar10", "--data-path", str(tmp_path / "cifar"),
         "--batch-size", "8", "--max-steps", "6", "--log-every", "2", "--metrics", str(metrics)],
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cifar10 (80 train / 16 test, 3x32x32, 10 classes)" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].startswith("done: 6 steps, final loss ")
    records = [json.loads(line) for line in (tmp_path / "metrics-0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6]
    assert {"loss", "samples_per_s", "step_time_s", "data_wait_share", "rank"} <= set(records[0])
    assert all(r["rank"] == 0 and r["samples_per_s"] > 0 for r in records)


def test_mlp_trains_on_an_npz_file_end_to_end(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 96)
    inputs = (rng.normal(size=(96, 5)) + 3 * labels[:, None]).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=inputs, y=labels)
    result = run_trainer(["--dataset", "npz", "--data-path", str(tmp_path / "d.npz"),
                          "--batch-size", "8", "--epochs", "3", "--lr", "0.05"])  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "npz (96 train, no test split, 5, 3 classes)" in result.stdout
    losses = [float(line.split()[5]) for line in result.stdout.splitlines()
              if line.startswith("step ")]  # fmt: skip
    assert len(losses) >= 5 and losses[-1] < losses[0] / 2
