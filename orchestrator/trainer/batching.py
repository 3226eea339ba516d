"""Which samples each rank and micro-step trains on, and getting them onto the device.

The global batch of optimizer step ``s`` is a fixed set of sample indices: a slice of a
permutation drawn from (seed, epoch) alone. How that batch is split over ranks and
accumulation micro-steps changes only who computes which part of the same mean
gradient, so W ranks x batch b x accumulation a trains the same model as any other
split with the same W*b*a (up to float summation order).

DistributedSampler does not give this: it deals a permutation out round-robin per rank
and each rank then batches its own stream, so the samples that meet in one optimizer
step depend on the world size.

Samples left over after the last full global batch of an epoch are dropped, so every
step averages over exactly ``global_batch`` samples; the next epoch's permutation gives
them their turn.
"""

from __future__ import annotations

import numpy as np
import torch

from orchestrator.trainer.datasets import InputTransform, Split
from orchestrator.trainer.exits import TrainerUsageError


class GlobalBatchPlan:
    """Maps an optimizer step to its global batch (which rank takes which part: split.py)."""

    def __init__(self, num_samples: int, global_batch: int, seed: int) -> None:
        if global_batch > num_samples:
            raise TrainerUsageError(
                f"global batch {global_batch} (world size x --batch-size x --grad-accum, "
                f"or --global-batch) exceeds the {num_samples} training samples; lower "
                "--batch-size, --grad-accum or --global-batch"
            )
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.seed = seed
        self.steps_per_epoch = num_samples // global_batch
        self._epoch: int | None = None
        self._permutation = torch.empty(0, dtype=torch.long)

    def permutation(self, epoch: int) -> torch.Tensor:
        """The sample order of ``epoch``, a function of (seed, epoch) only."""
        if epoch != self._epoch:
            # SeedSequence mixes the pair so that neighbouring (seed, epoch) pairs give
            # unrelated streams; keep 63 bits so manual_seed accepts it everywhere.
            state = np.random.SeedSequence([self.seed, epoch]).generate_state(2, np.uint32)
            gen_seed = (int(state[0]) << 31) ^ int(state[1])
            gen = torch.Generator().manual_seed(gen_seed)
            self._permutation = torch.randperm(self.num_samples, generator=gen)
            self._epoch = epoch
        return self._permutation

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, step within the epoch) of global optimizer step ``step`` (0-based)."""
        return divmod(step, self.steps_per_epoch)

    def global_indices(self, step: int) -> torch.Tensor:
        """The ``global_batch`` sample indices of optimizer step ``step``."""
        epoch, within = self.position(step)
        start = within * self.global_batch
        return self.permutation(epoch)[start : start + self.global_batch]


class BatchFeeder:
    """Gathers a batch from the in-memory split and puts it on the device, ready to use.

    On CUDA the gather writes straight into pinned host memory and the copy is issued
    with ``non_blocking=True``. Because the host runs ahead of the GPU, gathering the
    next micro-batch overlaps with the kernels of the current one; torch's pinned-memory
    cache keeps a buffer alive until its copy has finished, so no manual ring is needed.
    """

    def __init__(self, split: Split, device: torch.device, transform: InputTransform) -> None:
        self.inputs = split.inputs
        self.labels = split.labels
        self.device = device
        self.transform = transform
        self.pinned = device.type == "cuda"

    def fetch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.pinned:
            x = self.inputs.index_select(0, indices)
            y = self.labels.index_select(0, indices)
            return self.transform(x), y
        n = indices.shape[0]
        x_host = torch.empty((n, *self.inputs.shape[1:]), dtype=self.inputs.dtype, pin_memory=True)
        y_host = torch.empty((n,), dtype=self.labels.dtype, pin_memory=True)
        torch.index_select(self.inputs, 0, indices, out=x_host)
        torch.index_select(self.labels, 0, indices, out=y_host)
        x = x_host.to(self.device, non_blocking=True)
        y = y_host.to(self.device, non_blocking=True)
        return self.transform(x), y
