"""Everything built before the first step: data, model, optimizer, and the resumed state.

Setup errors are agreed on by all ranks before anyone moves on: a rank that failed
alone (say, a dataset file missing on one node) would otherwise leave the others
waiting in their first collective until a timeout.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from orchestrator.trainer.batching import BatchFeeder, GlobalBatchPlan
from orchestrator.trainer.channel import MetricsChannel, open_channel
from orchestrator.trainer.checkpoint import (
    check_compatible,
    find_latest,
    load_checkpoint,
    restore_rng_state,
)
from orchestrator.trainer.config import TrainConfig
from orchestrator.trainer.datasets import Dataset, InputTransform, load_dataset
from orchestrator.trainer.distributed import Runtime
from orchestrator.trainer.exits import CheckpointError, TrainerUsageError
from orchestrator.trainer.models import build_model
from orchestrator.trainer.reporting import MetricsWriter, emit
from orchestrator.trainer.split import BatchSplit, plan_split


@dataclass
class Session:
    """The objects a training run works with."""

    config: TrainConfig
    runtime: Runtime
    dataset: Dataset
    plan: GlobalBatchPlan
    split: BatchSplit
    feeder: BatchFeeder
    model: nn.Module  # the plain module; DDP wraps it later
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    autocast: Callable[[], AbstractContextManager[Any]]
    total_steps: int
    metrics: MetricsWriter
    start_step: int = 0
    resumed_from: Path | None = None
    resumed_loss: float | None = None
    channel: MetricsChannel | None = None  # ORCHESTRATOR_METRICS_FILE, when set

    def close(self) -> None:
        self.metrics.close()
        if self.channel is not None:
            self.channel.close()

    @property
    def identity(self) -> dict[str, Any]:
        """The settings a checkpoint must share with the run that resumes from it."""
        return {
            "model": self.config.model,
            "dataset": self.dataset.identity(),
            "global_batch": self.plan.global_batch,
            "seed": self.config.seed,
        }


def agree_on_errors(runtime: Runtime, error: str | None) -> None:
    """Raise the same TrainerUsageError on every rank if any rank reported one."""
    if error is not None:
        runtime.all_gather_objects(error)
        raise TrainerUsageError(error)
    for rank, message in enumerate(runtime.all_gather_objects(None)):
        if message is not None:
            raise TrainerUsageError(f"rank {rank} failed: {message}")


def autocast_factory(
    precision: str, device: torch.device
) -> Callable[[], AbstractContextManager[Any]]:
    """A context-manager factory for the forward pass under ``precision``.

    fp32: nothing. bf16: autocast on CUDA (needs bf16 support) and on CPU, where it
    works but only pays off on CPUs with native bf16 (AMX, AVX512-BF16); parameters,
    gradients and optimizer state stay fp32 either way. fp16: CUDA only, with a
    GradScaler; CPUs have no fast fp16 path.
    """
    if precision == "fp32":
        return nullcontext
    if precision == "fp16" and device.type != "cuda":
        raise TrainerUsageError(
            "--precision fp16 needs a CUDA device; on CPU use --precision bf16 or fp32"
        )
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise TrainerUsageError(
            "--precision bf16: this GPU has no bf16 support; use --precision fp16 or fp32"
        )
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    # Weight cache off: recording CUDA graphs needs it off (graphs.py), and each weight of
    # the bundled models is cast once per forward, so it saved nothing.
    return lambda: torch.autocast(device.type, dtype=dtype, cache_enabled=False)


def build_session(config: TrainConfig, runtime: Runtime) -> Session:
    """Build everything on every rank; any rank's bad input fails all ranks alike."""
    try:
        session = _build(config, runtime)
    except TrainerUsageError as exc:
        agree_on_errors(runtime, str(exc))
        raise
    agree_on_errors(runtime, None)
    _resume(session)
    session.channel = open_channel(session.split.samples(runtime.rank))
    return session


def _build(config: TrainConfig, runtime: Runtime) -> Session:
    autocast = autocast_factory(config.precision, runtime.device)
    dataset = load_dataset(
        config.dataset,
        config.data_path,
        model=config.model,
        seed=config.seed,
        synthetic_samples=config.synthetic_samples,
    )
    split = plan_split(config, runtime.world_size, runtime.topology.launch_world_size)
    plan = GlobalBatchPlan(len(dataset.train), split.global_batch, config.seed)
    # Same seed on every rank, so every rank builds identical initial weights (DDP
    # would broadcast rank 0's anyway) and every split starts from the same model.
    torch.manual_seed(config.seed)
    if runtime.device.type == "cuda":
        # Every training batch has the same shape (a short last batch is dropped), so
        # cuDNN's one-time search for the fastest convolution pays off from then on.
        torch.backends.cudnn.benchmark = True
    model = build_model(config.model, dataset.sample_shape, dataset.num_classes)
    model.to(runtime.device)
    # foreach: one batched update for all parameters instead of a Python loop over them;
    # torch picks it on its own only for CUDA tensors, but it pays on CPU as well.
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum, foreach=True
    )
    scaler = torch.amp.GradScaler("cuda") if config.precision == "fp16" else None
    total = config.epochs * plan.steps_per_epoch
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    feeder = BatchFeeder(dataset.train, runtime.device, InputTransform(dataset, runtime.device))
    if runtime.is_main and config.checkpoint_dir is not None:
        _check_writable(config.checkpoint_dir)
    metrics = _open_metrics(config.metrics, runtime)
    return Session(
        config,
        runtime,
        dataset,
        plan,
        split,
        feeder,
        model,
        optimizer,
        scaler,
        autocast,
        total,
        metrics,
    )


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrainerUsageError(
            f"--checkpoint-dir {directory}: cannot create it ({exc.strerror})"
        ) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise TrainerUsageError(f"--checkpoint-dir {directory}: not writable by this user")


def _open_metrics(template: str | None, runtime: Runtime) -> MetricsWriter:
    try:
        return MetricsWriter(template, runtime.rank, runtime.world_size)
    except OSError as exc:
        raise TrainerUsageError(
            f"--metrics {template}: cannot open for rank {runtime.rank} ({exc.strerror})"
        ) from None


def _resume(session: Session) -> None:
    """Load the checkpoint on rank 0 and broadcast it, so nodes need no shared disk."""
    config, runtime = session.config, session.runtime
    if config.resume is None:
        return
    payload: dict[str, Any] | str | None = None
    if runtime.is_main:
        try:
            payload = _read_resume_checkpoint(session)
        except CheckpointError as exc:
            payload = str(exc)
    payload = runtime.broadcast_object(payload)
    if isinstance(payload, str):
        raise CheckpointError(payload)
    if payload is None:
        return
    path, state = Path(payload["path"]), payload["state"]
    try:
        session.model.load_state_dict(state["model"])
        session.optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        reason = (str(exc).strip().splitlines() or [""])[0][:160]
        raise CheckpointError(f"--resume {path}: does not fit this model ({reason})") from None
    for group in session.optimizer.param_groups:  # the command line's values win
        group["lr"] = config.lr
        group["momentum"] = config.momentum
    if session.scaler is not None and state.get("scaler"):
        session.scaler.load_state_dict(state["scaler"])
    rng = state["rng"]
    if len(rng) == runtime.world_size:
        restore_rng_state(rng[runtime.rank])
    elif runtime.is_main:
        # Training itself draws no random numbers after setup (the sample order comes
        # from the seed and epoch), so only user additions would notice.
        emit(
            f"note: {path} holds RNG states for {len(rng)} rank(s), this run has "
            f"{runtime.world_size}; random number streams start from --seed instead"
        )
    session.start_step = int(state["step"])
    session.resumed_from = path
    session.resumed_loss = state.get("loss")


def _read_resume_checkpoint(session: Session) -> dict | None:
    config = session.config
    path = config.resume_path
    if path is None and config.checkpoint_dir is not None:  # --resume without a path
        path = find_latest(config.checkpoint_dir)
        if path is None:
            emit(f"no checkpoint in {config.checkpoint_dir} yet; starting from step 0")
            return None
    if path is None:
        raise CheckpointError("--resume needs a PATH or --checkpoint-dir")
    state = load_checkpoint(path)
    check_compatible(path, state["run"], session.identity)
    _check_steps_left(path, int(state["step"]), session)
    return {"path": str(path), "state": state}


def _check_steps_left(path: Path, step: int, session: Session) -> None:
    """Refuse a checkpoint beyond this run's total.

    "Finishing" would overwrite the checkpoint and final.pt of a longer run under a
    shorter run's name. A checkpoint at the total itself resumes to a finished run (the
    same command run again, or a requeue after the last step), which is no mistake.
    """
    total, config = session.total_steps, session.config
    if step <= total:
        return
    per_epoch = session.plan.steps_per_epoch
    if config.max_steps is not None and config.max_steps == total:
        limit = f"--max-steps {config.max_steps}"
    else:
        limit = f"--epochs {config.epochs} x {per_epoch} steps per epoch"
    fixes = []
    if config.max_steps is not None and config.max_steps <= step:
        fixes.append(f"--max-steps above {step}")
    if config.epochs * per_epoch <= step:
        fixes.append(f"--epochs to at least {step // per_epoch + 1}")
    raise CheckpointError(
        f"--resume {path}: the checkpoint is at step {step} but this run trains {total} "
        f"steps in total ({limit}); to train further raise "
        f"{' and '.join(fixes)} (steps count from 0, resumed ones included)"
    )
