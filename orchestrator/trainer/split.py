"""How one global batch is divided over the ranks and their micro-steps (pure: no torch).

The global batch G of a step is a fixed set of samples (batching.py). It is cut into
blocks that depend on G and --batch-size b alone, never on the world: n = ceil(G / b)
contiguous blocks whose sizes differ by at most one (n = launch world x accumulation
blocks of exactly b when G is the launch's). A rank takes whole blocks, dealt round-robin:
in micro-step m, rank r trains on block m x W + r. With W x b x a given on the command
line that is the split the trainer always used; on a world that shrank (or grew back)
under a kept G, every block is still the launch's, ranks take one block more or less
than each other, and only the last micro-step, which reduces the gradients, has to meet
the other ranks. A rank with no block left (more ranks than blocks, only possible with
--global-batch) trains on an empty micro-batch, so it still meets them.

Every block's gradient is then the launch's own, bit for bit: the same samples in the
same shape through the same weights, the loss summed over the block and divided by G
(the same for every block and world). How the n block gradients are added up is
gradients.py's: exactly, so the order the ranks add them in does not matter either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.trainer.config import TrainConfig
from orchestrator.trainer.exits import TrainerUsageError


@dataclass(frozen=True)
class MicroBatch:
    """One micro-step's slice of the step's global indices (``count`` may be 0: idle)."""

    start: int
    count: int


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

    def blocks(self) -> tuple[MicroBatch, ...]:
        """The step's blocks, in order: a function of G and --batch-size alone."""
        count = math.ceil(self.global_batch / self.batch_size)
        size, extra = divmod(self.global_batch, count)
        parts, start = [], 0
        for index in range(count):
            k = size + (index < extra)
            parts.append(MicroBatch(start, k))
            start += k
        return tuple(parts)

    @property
    def even(self) -> bool:
        """Every block has --batch-size samples and every rank takes as many."""
        blocks = self.global_batch // self.batch_size
        return self.global_batch % self.batch_size == 0 and blocks % self.world_size == 0

    def micro_batches(self, rank: int) -> tuple[MicroBatch, ...]:
        """The blocks ``rank`` trains on, one per micro-step, in order."""
        own = self.blocks()[rank :: self.world_size]
        return own or (MicroBatch(0, 0),)

    def samples(self, rank: int) -> int:
        """How many of the global batch's samples ``rank`` trains on in every step."""
        return sum(part.count for part in self.micro_batches(rank))

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
            sizes = sorted({part.count for part in self.blocks()})
            steps = sorted({len(self.blocks()[r::world]) for r in (0, world - 1)})
            ranks += (
                f" x {'-'.join(map(str, steps))} micro-batch(es) of "
                f"{'-'.join(map(str, sizes))} per step"
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
