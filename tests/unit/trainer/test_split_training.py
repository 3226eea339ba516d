"""The same model on any world, bit for bit: the trainer's split, loss and gradient sums.

What this proves: for any launch world (1-8), any world a run goes on with after a
checkpoint (1-8, fewer or more ranks, and a second change of world later, as when a run
shrinks and grows back), a checkpoint at any step of an epoch, any epoch length and
leftover samples, batch size and accumulation (or --global-batch), every step's gradient,
over at least two epoch boundaries after the first change, is exactly the uninterrupted
run's (torch.equal, not within a tolerance), so by induction the weights are too: SGD's
step is a function of the weights, its momentum and the gradient. The trainer's own code
decides it: ``plan_split`` and ``BatchSplit`` (which blocks a rank takes, in which
micro-step), ``GlobalBatchPlan`` (which samples a step has), ``block_loss`` (how a block's
loss is scaled) and ``ExactGradients`` (a rank's sum over its micro-steps). The ranks are
simulated in one process: a block's gradient is computed once per step (every rank that
takes the block computes the same thing from the same weights), handed to each world's
ranks as autograd hands it to the trainer, and the all-reduce is a float64 sum over the
ranks in an order drawn anew every step, as gloo's ring takes its own. A tiny MLP with
ReLUs under SGD with momentum, as the trainer's.

What it does not prove: that DDP calls the hook with the buckets as the trainer expects,
that gloo sums float64 as a plain sum, that a checkpoint and ``--resume`` restore the
state, that the launcher gives the ranks the launch's world: the real trainer under
torchrun shows that (tests/local/test_trainer_equivalence.py), and on the lab cluster
with a node switched off mid-epoch and back (tests/cluster/test_shrink_cluster.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.trainer.batching import GlobalBatchPlan
from orchestrator.trainer.config import TrainConfig
from orchestrator.trainer.gradients import ExactGradients, block_loss
from orchestrator.trainer.split import BatchSplit, MicroBatch, plan_split

FEATURES, HIDDEN, CLASSES = 3, 6, 3
LR, MOMENTUM = 0.2, 0.9
# One flat parameter the forward slices: a rank's sums are one tensor, not four.
SHAPES = ((HIDDEN, FEATURES), (HIDDEN,), (CLASSES, HIDDEN), (CLASSES,))


def _params() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    size = sum(math.prod(shape) for shape in SHAPES)
    return [torch.randn(size, generator=gen).requires_grad_()]


def _forward(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    w1, b1, w2, b2 = (
        part.view(shape)
        for part, shape in zip(
            params[0].split([math.prod(shape) for shape in SHAPES]), SHAPES, strict=True
        )
    )
    return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


def _block_gradients(params, split: BatchSplit, indices, x, y) -> dict:
    """Each block's float32 gradient, as the rank that takes it computes it."""
    grads = {MicroBatch(0, 0): [torch.zeros_like(p) for p in params]}  # an idle rank's
    for block in split.blocks():
        own = indices[block.start : block.start + block.count]
        _, scaled = block_loss(_forward(params, x[own]), y[own], split.global_batch)
        grads[block] = torch.autograd.grad(scaled, params)
    return grads


def _step_gradient(params, split: BatchSplit, blocks: dict, order, exact=True) -> list:
    """The step's gradient on ``split``'s world: each rank's micro-steps through the
    trainer's ExactGradients, then the ranks' sums added in ``order``."""
    ranks = []
    for rank in range(split.world_size):
        sums = ExactGradients(params)
        parts = split.micro_batches(rank)
        for micro, part in enumerate(parts):
            for p, g in zip(params, blocks[part], strict=True):
                p.grad = g.clone()  # autograd's, into gradients zeroed since
            if micro < len(parts) - 1:
                sums.hold()
        ranks.append([sums.with_held(p, p.grad) for p in params])
        for p in params:
            p.grad = None
    if not exact:  # float32 sums, as the trainer took them before
        return [sum(ranks[r][i].float() for r in order) for i in range(len(params))]
    return [sum(ranks[r][i] for r in order).float() for i in range(len(params))]


def _data(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=gen)
    return x, torch.randint(0, CLASSES, (samples,), generator=gen)


def _compare(config, worlds, cuts, total, samples, seed, exact=True) -> list[int]:
    """Train the uninterrupted run on ``worlds[0]`` ranks; from step ``cuts[i - 1]`` on,
    also take each step's gradient as the run continued on ``worlds[i]`` would. The
    steps where the two gradients differ."""
    x, y = _data(samples, seed)
    launch = plan_split(config, worlds[0], None)
    plan = GlobalBatchPlan(samples, launch.global_batch, config.seed)
    params = _params()
    momentum = [torch.zeros_like(p) for p in params]
    gen = torch.Generator().manual_seed(seed)
    differ = []
    for step in range(total):
        world = worlds[sum(step >= cut for cut in cuts)]
        split = plan_split(config, world, worlds[0] if world != worlds[0] else None)
        assert split.global_batch == plan.global_batch and split.blocks() == launch.blocks()
        blocks = _block_gradients(params, launch, plan.global_indices(step), x, y)
        order = torch.randperm(launch.world_size, generator=gen).tolist()
        straight = _step_gradient(params, launch, blocks, order, exact)
        if step >= cuts[0]:
            order = torch.randperm(world, generator=gen).tolist()
            went_on = _step_gradient(params, split, blocks, order, exact)
            if not all(torch.equal(a, b) for a, b in zip(straight, went_on, strict=True)):
                differ.append(step)
        with torch.no_grad():  # SGD with momentum as torch's (dampening 0), 20x cheaper here
            for p, buf, g in zip(params, momentum, straight, strict=True):
                p.sub_(buf.mul_(MOMENTUM).add_(g), alpha=LR)
    return differ


@contextmanager
def one_thread() -> Iterator[None]:
    """Tiny tensors: a second thread only costs (10x, on 2 busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@st.composite
def elastic_runs(draw):
    """A run's shape, and the worlds it goes on with after two checkpoints."""
    launch = draw(st.integers(1, 8))
    batch = draw(st.integers(1, 4))
    if draw(st.booleans()):
        config = TrainConfig(batch_size=batch, grad_accum=draw(st.integers(1, 3)))
        global_batch = launch * batch * config.grad_accum
    else:  # --global-batch, any size the ranks can share
        global_batch = draw(st.integers(launch, 3 * launch * batch))
        config = TrainConfig(batch_size=batch, global_batch=global_batch)
    per_epoch = draw(st.integers(1, 3))
    samples = global_batch * per_epoch + draw(st.integers(0, global_batch - 1))
    top = min(8, global_batch)
    worlds = [launch, draw(st.integers(1, top)), draw(st.integers(1, top))]
    # The first change of world anywhere in the first two epochs; the run then crosses
    # at least two epoch boundaries, the second change (growing back, say) among them.
    first = draw(st.integers(1, 2 * per_epoch))
    total = (first // per_epoch + 2) * per_epoch + 1
    second = draw(st.integers(first, total - 1))
    return config, worlds, [first, second], total, samples


@settings(max_examples=200, deadline=None)
@given(run=elastic_runs(), seed=st.integers(0, 2**16))
def test_any_world_from_any_step_trains_the_uninterrupted_model_bit_for_bit(run, seed) -> None:
    config, worlds, cuts, total, samples = run
    with one_thread():
        assert _compare(config, worlds, cuts, total, samples, seed) == []


def test_the_comparison_can_fail_float32_sums_differ_between_worlds() -> None:
    """What the trainer did before, float32 sums whose order is the world's, is caught."""
    config = TrainConfig(batch_size=4)
    with one_thread():
        assert _compare(config, [4, 3, 4], [2, 20], 30, 200, 1, exact=False)
        assert _compare(config, [4, 3, 4], [2, 20], 30, 200, 1) == []
