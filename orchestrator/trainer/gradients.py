"""A step's gradient as the exact sum of its blocks' gradients, on any world.

Every block of a step (split.py) has its gradient computed in float32 from the same
samples, shape and weights on every world, so it is the same bit for bit. What differs
between worlds is how the blocks' gradients are added: a rank adds its own blocks first,
then the all-reduce adds the ranks' partial sums in an order of its own (gloo's ring
starts each chunk at another rank). In float32 each addition rounds, so 4 ranks x 1
block and 3 ranks x 1-2 blocks give gradients a few ulps apart, and training does not
keep them small: a ReLU whose input lies within them of 0 passes the gradient in one run
and not the other, and from then on the two runs drift apart (reported from one CPU, 4
ranks resumed on 3 at step 20: 1.5e-8 at step 40, 2.4e-5 at 60, 3.3e-4 at 180).

So the sums are taken in float64 (a rank's own blocks, then the all-reduce). Adding
float32 numbers in float64 is exact while their magnitudes lie within 2^(29 - log2 n)
of each other for n addends (2^27 for 4 blocks): the 24-bit significands then fit in 53
bits, whatever the order. The sum is rounded to float32 once, at the end, so every world
gets the launch's gradient bit for bit. Where a parameter's block gradients are further
apart (one block's 10^8 times another's), the float64 sum rounds below float32's last
bit, and the float32 result differs only if that lands on a float32 rounding boundary.
The cost: the all-reduce carries float64 (twice the bytes), and a rank with more than one
micro-step holds a float64 copy of the gradients.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def block_loss(
    logits: torch.Tensor, labels: torch.Tensor, global_batch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A block's loss: its samples' sum (what reports add up) and that divided by G
    (what backward takes), the same for every block on every world."""
    total = F.cross_entropy(logits, labels, reduction="sum")
    return total, total / global_batch


class ExactGradients:
    """Float64 sums of a rank's gradients over one step's micro-steps, and their reduction."""

    def __init__(self, parameters: Iterable[nn.Parameter]) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        self._sums: dict[nn.Parameter, torch.Tensor] = {}
        self._held = False

    def hold(self) -> None:
        """After a micro-step that does not reduce: move its gradients into the sums."""
        for p in self.parameters:
            if p.grad is None:
                continue
            if p not in self._sums:
                self._sums[p] = torch.zeros_like(p, dtype=torch.float64)
            self._sums[p].add_(p.grad)
            p.grad.zero_()
        self._held = True

    def with_held(self, p: nn.Parameter, grad: torch.Tensor) -> torch.Tensor:
        """``grad`` in float64 with what this rank held for ``p`` added (and let go)."""
        total = grad.to(torch.float64)
        held = self._sums.get(p) if self._held else None
        if held is not None:
            total += held
            held.zero_()
        return total

    def finish_alone(self) -> None:
        """One rank, no all-reduce: each gradient becomes its exact sum, rounded once."""
        if self._held:
            for p in self.parameters:
                if p.grad is not None:
                    p.grad.copy_(self.with_held(p, p.grad))
        self._held = False

    def reduced(self) -> None:
        """After the micro-step whose backward ran ``hook``: the sums are empty again."""
        self._held = False

    def hook(self, group: dist.ProcessGroup, bucket):
        """DDP's communication hook: the bucket's exact sum over every rank's blocks.

        Registered instead of DDP's average: the loss is already divided by the global
        batch (split.py), so the ranks' gradients are summed, not averaged. (``bucket``
        is a dist.GradBucket and the result a Future of its buffer; unannotated, since
        DDP compares the annotations with the classes themselves, and this module's
        annotations are strings.)
        """
        buffer = bucket.buffer()
        # The gradients are views of the flat buffer (gradient_as_bucket_view, and DDP
        # copies them in otherwise): one conversion of it, then what this rank held added
        # in place, where each gradient lies. The same float64 values as converting each
        # gradient and adding its sum, without a cat of the bucket per step.
        total = buffer.to(torch.float64)
        if self._held:
            base = buffer.storage_offset()
            for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
                held = self._sums.get(p)
                if held is not None:
                    start = g.storage_offset() - base
                    total[start : start + g.numel()] += held.view(-1)
                    held.zero_()
        work = dist.all_reduce(total, group=group, async_op=True)
        return work.get_future().then(lambda done: buffer.copy_(done.value()[0]))
