"""Resuming: what a checkpoint restores (RNG, grad scaler), and what it refuses."""

from __future__ import annotations

import os
import random
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.trainer import checkpoint
from orchestrator.trainer.checkpoint import (
    FORMAT,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from orchestrator.trainer.config import Topology, TrainConfig
from orchestrator.trainer.distributed import Runtime
from orchestrator.trainer.exits import CheckpointError
from orchestrator.trainer.loop import Trainer
from orchestrator.trainer.setup import _resume, build_session
from tests.trainer_helpers import FAST, assert_clean_failure, run_trainer


def _state(step: int, **extra: object) -> dict:
    return {
        "format": FORMAT,
        "step": step,
        "epoch": 0,
        "step_in_epoch": step,
        "model": {"w": torch.zeros(2)},
        "optimizer": {},
        "run": {},
        "rng": [],
        **extra,
    }


def test_resume_from_a_checkpoint_past_the_total_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    # 64 samples / global batch 4: 16 steps per epoch, so --epochs 1 means 16 steps.
    small = [*FAST, "--synthetic-samples", "64", "--batch-size", "4"]
    first = run_trainer([*small, "--max-steps", "20", "--checkpoint-dir", str(directory)])
    assert first.returncode == 0, first.stdout + first.stderr
    before = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    checkpoint_20 = directory / "ckpt-00000020.pt"
    for limit, needles in (
        (["--max-steps", "10"], ["trains 10 steps", "(--max-steps 10)", "--max-steps above 20"]),
        (["--epochs", "1"], ["trains 16 steps", "--epochs 1 x 16 steps per epoch",
                             "--epochs to at least 2"]),
    ):  # fmt: skip
        result = run_trainer([*small, *limit, "--checkpoint-dir", str(directory), "--resume"])
        assert_clean_failure(result, f"--resume {checkpoint_20}", "at step 20", *needles)
    # Nothing was "finished" again: the longer run's files are untouched.
    assert {p.name: p.stat().st_mtime_ns for p in directory.iterdir()} == before
    # At the total itself: the run is finished, as the same command run again finds it.
    again = run_trainer(
        [*small, "--max-steps", "20", "--checkpoint-dir", str(directory), "--resume"]
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "at step 20" in again.stdout


def test_resume_path_problems_say_what_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="is a directory holding no checkpoints"):
        load_checkpoint(empty)

    directory = tmp_path / "ckpt"
    for step in (5, 7):
        save_checkpoint(directory, _state(step), keep=0)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(directory)
    newest = directory / "ckpt-00000007.pt"
    assert "is a checkpoint directory, not a checkpoint file" in str(caught.value)
    assert f"pass --resume {newest}" in str(caught.value)
    assert f"--checkpoint-dir {directory} --resume" in str(caught.value)

    newest.chmod(0)
    if os.access(newest, os.R_OK):  # root reads anything: refuse where torch opens it

        def deny(f: object, *args: object, **kwargs: object) -> None:
            raise PermissionError(13, "Permission denied", str(f))

        monkeypatch.setattr(checkpoint.torch, "load", deny)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(newest)
    assert "permission denied" in str(caught.value)
    assert "corrupt" not in str(caught.value)


def _draws() -> tuple[object, ...]:
    return (
        torch.rand(4).tolist(),
        torch.randn(2).tolist(),
        np.random.rand(4).tolist(),
        float(np.random.standard_normal()),  # uses the cached second Gaussian first
        [random.random() for _ in range(4)],
    )


def test_restore_rng_state_restores_torch_numpy_and_python(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.standard_normal()  # leaves a cached Gaussian in NumPy's legacy state
    # Through a checkpoint file, as a resume reads it (weights_only=True).
    save_checkpoint(tmp_path, _state(1, rng=[capture_rng_state()]), keep=0)
    first = _draws()
    assert _draws() != first  # the streams did move on
    restore_rng_state(load_checkpoint(tmp_path / "ckpt-00000001.pt")["rng"][0])
    assert _draws() == first


def test_grad_scaler_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    # fp16 (and the CUDA GradScaler built for it) needs a GPU. A CPU GradScaler runs the
    # same trainer code: scaled backward, scaler.step/update, and its state_dict saved
    # into the checkpoint and loaded back on resume.
    runtime = Runtime(Topology(0, 1, 0, 1, None, "single"), torch.device("cpu"), None, 1)
    config = TrainConfig(
        synthetic_samples=256, batch_size=8, max_steps=3, evaluate=False, checkpoint_dir=tmp_path
    )
    session = build_session(config, runtime)
    session.scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2)
    assert Trainer(session, time.perf_counter()).train() == 0
    saved = load_checkpoint(tmp_path / "ckpt-00000003.pt")["scaler"]
    # Three finite steps with growth every two: it grew once and counts one since.
    assert saved["scale"] == 512.0 and saved["_growth_tracker"] == 1, saved
    assert saved == session.scaler.state_dict()

    resumed = build_session(config, runtime)
    resumed.scaler = torch.amp.GradScaler("cpu")
    assert resumed.scaler.state_dict() != saved
    resumed.config = replace(config, max_steps=6, resume=str(tmp_path / "ckpt-00000003.pt"))
    resumed.total_steps = 6
    _resume(resumed)
    assert resumed.start_step == 3
    assert resumed.scaler.state_dict() == saved
