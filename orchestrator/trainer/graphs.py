"""The model's forward and backward on a GPU, recorded once as CUDA graphs and replayed.

A small model's step is bound by the CPU launching its kernels one at a time (LeNet's
forward and backward are some sixty launches for well under a millisecond of GPU work);
replayed from a graph, each is one launch. Only the module is graphed: the loss, DDP's
gradient all-reduce (eager, so NCCL's timeout and error handling apply as before) and
the optimizer step run as written.

A graph replays fixed shapes into fixed buffers, so it is used only where that holds:
every micro-batch of the plan has the same shape (a short last batch is dropped; a rank
of an uneven split always takes the same number of samples), and with one micro-step
per optimizer step only (--grad-accum 1, and no extra accumulation on a smaller world):
the replayed backward writes each gradient into one reused buffer, which autograd may
hand to a parameter as its .grad, and a second micro-step would then add that buffer to
itself. Evaluation (``model.eval()``) runs the module as
written. Autocast's weight cache must be off while recording; the trainer's autocast
keeps it off everywhere (each weight of the bundled models is cast once per forward,
so the cache saved nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn


def applies(enabled: bool, device: torch.device, micro_steps: int) -> bool:
    """Whether the step is graphed: on CUDA, with one micro-step per optimizer step (as
    with --grad-accum 1), unless --no-cuda-graphs."""
    return enabled and device.type == "cuda" and micro_steps == 1


def graph_module(
    model: nn.Module,
    sample: torch.Tensor,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> tuple[nn.Module, str | None]:
    """``model`` with its training forward and backward replayed as CUDA graphs.

    ``sample`` is one micro-batch as the loop will feed it (shape, dtype, device). The
    parameters stay the same tensors, so the optimizer, DDP and checkpoints see no
    difference. If recording fails, returns the module unchanged and the reason.
    """
    # The recording keeps its autograd graph, and with it each parameter's gradient
    # accumulator, on the stream it recorded on; torch then warns on every rank's stderr
    # that replayed gradients arrive from another stream. That is how graphed modules
    # work (the streams are ordered by an event, no host wait), so the warning goes.
    quiet = getattr(torch.autograd.graph, "set_warn_on_accumulate_grad_stream_mismatch", None)
    if quiet is not None:
        quiet(False)
    try:
        with autocast():
            graphed = torch.cuda.make_graphed_callables(model, (sample,))
    except RuntimeError as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        return model, f"CUDA graphs could not be recorded ({reason}); training without them"
    torch.cuda.synchronize()
    return graphed, None
