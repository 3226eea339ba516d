"""How one global batch is divided over the ranks and their micro-steps (pure: no torch).

The global batch G of a step is a fixed set of samples (batching.py); this module says
which contiguous slices of it each rank trains on, and how each slice's mean loss is
scaled so that, after DDP's average over the W ranks, the gradient is the sum of the G
per-sample gradients divided by G, whatever the split.

Even split (G divides by W x --batch-size b): a = G / (W b) micro-steps; in micro-step m
rank r takes the r-th block of b samples inside the m-th block of W b. Every slice has b
samples and its loss is divided by a. With W x b x a given on the command line this is
the only split there is.

Uneven split (the world shrank under a kept G, or --global-batch): rank r takes one
contiguous shard of G // W samples, the first G % W ranks one more, cut into
ceil(n_r / b) micro-batches whose sizes differ by at most one, so no micro-batch is
larger than b and memory per micro-step never grows. A micro-batch of k samples has its
mean loss divided by G / (k W): its gradient is then W / G times the sum of its k
per-sample gradients, and DDP's average over W ranks leaves the sum over all G divided
by G. Ranks may take different numbers of micro-steps (at most one apart): only the
last, which all-reduces the gradients, has to meet the other ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.trainer.config import TrainConfig
from orchestrator.trainer.exits import TrainerUsageError


@dataclass(frozen=True)
class MicroBatch:
    """One micro-step's slice of the step's global indices, and its loss divisor."""

    start: int
    count: int
    # The micro-batch's mean loss is divided by this before backward: G / (count x W).
    divisor: float


@dataclass(frozen=True)
class BatchSplit:
    """The global batch of every step and how it is divided over ``world_size`` ranks."""

    global_batch: int
    world_size: int
    batch_size: int  # --batch-size: the most samples a rank computes in one micro-step
    # The world the run was launched with, when it differs from this one (the global
    # batch is then the launch's, kept).
    launch_world_size: int | None = None
    asked: bool = False  # the global batch came from --global-batch

    def __post_init__(self) -> None:
        if self.global_batch < self.world_size:
            raise TrainerUsageError(
                f"global batch {self.global_batch} cannot be shared by {self.world_size} "
                "ranks: each needs at least one sample; raise --global-batch or --batch-size, "
                "or train on fewer ranks"
            )

    @property
    def even(self) -> bool:
        return self.global_batch % (self.world_size * self.batch_size) == 0

    def samples(self, rank: int) -> int:
        """How many of the global batch's samples ``rank`` trains on in every step."""
        base, extra = divmod(self.global_batch, self.world_size)
        return base + (rank < extra)

    def micro_batches(self, rank: int) -> tuple[MicroBatch, ...]:
        """The slices ``rank`` trains on, one per micro-step, in order."""
        world, batch, total = self.world_size, self.batch_size, self.global_batch
        if self.even:
            accum = total // (world * batch)
            return tuple(
                MicroBatch((micro * world + rank) * batch, batch, float(accum))
                for micro in range(accum)
            )
        base, extra = divmod(total, world)
        start, count = rank * base + min(rank, extra), self.samples(rank)
        steps = math.ceil(count / batch)
        size, extra = divmod(count, steps)
        parts = []
        for micro in range(steps):
            k = size + (micro < extra)
            parts.append(MicroBatch(start, k, total / (k * world)))
            start += k
        return tuple(parts)

    @property
    def most_micro_steps(self) -> int:
        """Micro-steps per optimizer step of the busiest rank (rank 0)."""
        return len(self.micro_batches(0))

    def describe(self) -> str:
        """The header's account of the split, e.g. ``4 rank(s) x batch 32 x accum 1 = ...``."""
        world, batch, total = self.world_size, self.batch_size, self.global_batch
        ranks = f"{world} rank(s)"
        if self.launch_world_size is not None and not self.asked:
            ranks += f" (launched with {self.launch_world_size})"
        if self.even:
            ranks += f" x batch {batch} x accum {total // (world * batch)}"
        else:
            small, large = self.samples(world - 1), self.samples(0)
            samples = f"{small}-{large}" if small != large else f"{large}"
            steps = sorted({len(self.micro_batches(r)) for r in (0, world - 1)})
            ranks += (
                f" x {samples} samples (micro-batches of at most {batch}, "
                f"{'-'.join(map(str, steps))} per step)"
            )
        if self.asked:
            return f"{ranks} = global batch {total} (--global-batch)"
        if self.launch_world_size is not None:
            return f"{ranks} = global batch {total} kept"
        return f"{ranks} = global batch {total}"


def plan_split(config: TrainConfig, world_size: int, launch_world_size: int | None) -> BatchSplit:
    """The global batch this run trains with, and its split over ``world_size`` ranks.

    --global-batch wins; else the launch's world x --batch-size x --grad-accum when the
    run was launched with another world (ORCHESTRATOR_LAUNCH_WORLD_SIZE); else this
    world's product, as always.
    """
    batch, accum = config.batch_size, config.grad_accum
    if config.global_batch is not None:
        return BatchSplit(config.global_batch, world_size, batch, launch_world_size, asked=True)
    if launch_world_size is not None and launch_world_size != world_size:
        return BatchSplit(launch_world_size * batch * accum, world_size, batch, launch_world_size)
    return BatchSplit(world_size * batch * accum, world_size, batch)
