"""How a global batch is split over ranks and micro-steps, also on a world that shrank."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.trainer.config import (
    LAUNCH_WORLD_SIZE_ENV,
    TrainConfig,
    resolve_topology,
)
from orchestrator.trainer.exits import TrainerUsageError
from orchestrator.trainer.split import BatchSplit, MicroBatch, plan_split

TORCHRUN = {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "a", "MASTER_PORT": "1"}


@settings(max_examples=300, deadline=None)
@given(
    world=st.integers(1, 9),
    batch=st.integers(1, 40),
    extra=st.integers(0, 300),
)
def test_every_split_covers_the_global_batch_once_in_micro_batches_of_at_most_b(
    world: int, batch: int, extra: int
) -> None:
    split = BatchSplit(world + extra, world, batch)
    total = split.global_batch
    # The blocks depend on G and b alone: ceil(G / b) of them, sizes one apart.
    blocks = split.blocks()
    assert blocks == BatchSplit(total, 1, batch).blocks()
    assert len(blocks) == math.ceil(total / batch)
    assert max(b.count for b in blocks) - min(b.count for b in blocks) <= 1
    covered: list[int] = []
    steps = []
    for rank in range(world):
        parts = split.micro_batches(rank)
        # Rank r takes blocks r, r + W, r + 2W, ... whole; a rank with none left, one
        # empty micro-batch (it still meets the others in the all-reduce).
        assert parts == (blocks[rank::world] or (MicroBatch(0, 0),))
        assert all(part.count <= batch for part in parts)
        for part in parts:
            covered.extend(range(part.start, part.start + part.count))
        steps.append(len(parts))
        assert sum(part.count for part in parts) == split.samples(rank)
    assert sorted(covered) == list(range(total))  # every sample exactly once
    assert max(steps) - min(steps) <= 1 and split.most_micro_steps == max(steps)


@settings(max_examples=100, deadline=None)
@given(world=st.integers(1, 8), batch=st.integers(1, 16), accum=st.integers(1, 4))
def test_an_even_split_is_the_one_the_trainer_always_used(
    world: int, batch: int, accum: int
) -> None:
    # Micro-step m of rank r: the r-th block of b in the m-th block of W x b.
    split = BatchSplit(world * batch * accum, world, batch)
    assert split.even
    for rank in range(world):
        parts = split.micro_batches(rank)
        assert [(p.start, p.count) for p in parts] == [
            ((micro * world + rank) * batch, batch) for micro in range(accum)
        ]


def test_the_launch_global_batch_is_kept_on_a_smaller_world() -> None:
    config = TrainConfig(batch_size=32, grad_accum=1)
    # Hand-started (no launch world) or the world it was launched with: as always.
    for launch in (None, 4):
        same = plan_split(config, 4, launch)
        assert (same.global_batch, same.even) == (128, True)
        assert same.describe() == "4 rank(s) x batch 32 x accum 1 = global batch 128"
    # 4 -> 2: more accumulation, still the even split.
    two = plan_split(config, 2, 4)
    assert two.global_batch == 128 and two.most_micro_steps == 2
    assert two.describe() == (
        "2 rank(s) (launched with 4) x batch 32 x accum 2 = global batch 128 kept"
    )
    # 4 -> 3: the launch's 4 blocks of 32, rank 0 taking two (blocks 0 and 3).
    three = plan_split(config, 3, 4)
    assert [three.samples(r) for r in range(3)] == [64, 32, 32]
    assert [[(p.start, p.count) for p in three.micro_batches(r)] for r in range(3)] == [
        [(0, 32), (96, 32)], [(32, 32)], [(64, 32)]
    ]  # fmt: skip
    assert three.describe() == (
        "3 rank(s) (launched with 4) x 1-2 micro-batch(es) of 32 per step = global batch 128 kept"
    )
    small = plan_split(TrainConfig(batch_size=2), 3, 4)
    assert [len(small.micro_batches(r)) for r in range(3)] == [2, 1, 1]
    assert "x 1-2 micro-batch(es) of 2 per step" in small.describe()


def test_global_batch_flag_fixes_the_global_batch_on_any_world() -> None:
    config = TrainConfig(batch_size=32, global_batch=100)
    for world, launch in ((1, None), (3, None), (3, 4)):
        split = plan_split(config, world, launch)
        assert split.global_batch == 100
        assert split.describe().endswith("= global batch 100 (--global-batch)")
    # Blocks of G and b alone: 4 of 25, one a rank on 4 ranks, on 8 half of them idle.
    assert plan_split(config, 4, None).describe() == (
        "4 rank(s) x 1 micro-batch(es) of 25 per step = global batch 100 (--global-batch)"
    )
    eight = plan_split(config, 8, None)
    assert [eight.samples(r) for r in range(8)] == [25] * 4 + [0] * 4
    assert eight.describe().startswith("8 rank(s) x 0-1 micro-batch(es) of 25 per step")
    with pytest.raises(TrainerUsageError, match="--global-batch sets the accumulation itself"):
        TrainConfig(global_batch=64, grad_accum=2)
    with pytest.raises(TrainerUsageError, match="--global-batch 0: must be a positive"):
        TrainConfig(global_batch=0)
    with pytest.raises(TrainerUsageError, match="global batch 2 cannot be shared by 3 ranks"):
        plan_split(TrainConfig(global_batch=2), 3, None)


def test_the_launch_world_size_comes_from_the_environment() -> None:
    assert resolve_topology(TORCHRUN, None, None, None).launch_world_size is None
    topology = resolve_topology({**TORCHRUN, LAUNCH_WORLD_SIZE_ENV: "4"}, None, None, None)
    assert (topology.world_size, topology.launch_world_size) == (3, 4)
    alone = resolve_topology({LAUNCH_WORLD_SIZE_ENV: "2"}, None, None, None)
    assert (alone.world_size, alone.launch_world_size) == (1, 2)
    for bad, needle in (("0", "must be the positive"), ("four", "is not an integer")):
        with pytest.raises(TrainerUsageError, match=needle) as caught:
            resolve_topology({**TORCHRUN, LAUNCH_WORLD_SIZE_ENV: bad}, None, None, None)
        assert LAUNCH_WORLD_SIZE_ENV in str(caught.value)
