"""The trainer's cnn training step on one GPU, plain and with each speed-up on its own.

One process, a one-rank NCCL group and DDP around LeNet, as the trainer runs it under
torchrun on one GPU; batch 256 of 3x32x32 images already on the GPU, so only the step is
timed: forward under bf16 autocast, cross entropy, backward (DDP's all-reduce included),
SGD with momentum. Each variant changes one thing against "plain" (the trainer's step
before this benchmark: foreach SGD, NCHW):

    fused SGD         torch.optim.SGD(fused=True)
    channels_last     model and input in NHWC memory order
    graphed fwd+bwd   forward and backward replayed as CUDA graphs
                      (torch.cuda.make_graphed_callables, autocast cache off), DDP outside
    fp32 / fp32 tf32  no autocast, TF32 matmuls off / on

Variants alternate over the repetitions; the median samples/s of each and its ratio to
plain are printed, with the loss after the timed steps (every variant must still train).

    python benchmarks/cnn_step.py --reps 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from orchestrator.trainer.models import build_model  # noqa: E402

Step = Callable[[], torch.Tensor]


def make_step(variant: str, batch: int, device: torch.device) -> Step:
    torch.manual_seed(0)
    model = build_model("cnn", (3, 32, 32), 10).to(device)
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    bf16 = not variant.startswith("fp32")
    torch.backends.cuda.matmul.allow_tf32 = variant == "fp32 tf32"
    torch.backends.cudnn.allow_tf32 = variant == "fp32 tf32"
    if variant == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    autocast_cache = True
    if variant == "graphed fwd+bwd":
        autocast_cache = False  # make_graphed_callables needs it off
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            model = torch.cuda.make_graphed_callables(model, (x,))
    ddp = DistributedDataParallel(model, device_ids=[device.index], gradient_as_bucket_view=True)
    kind = {"fused": True} if variant == "fused SGD" else {"foreach": True}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, **kind)

    def step() -> torch.Tensor:
        with torch.autocast(
            "cuda", dtype=torch.bfloat16, enabled=bf16, cache_enabled=autocast_cache
        ):
            loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def timed(step: Step, steps: int, batch: int) -> tuple[float, float]:
    for _ in range(20):  # warm-up: cuDNN's search, allocator, NCCL's first call
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - start), float(loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA GPU on this machine")
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True  # as the trainer sets it
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    variants = ["plain", "fused SGD", "channels_last", "graphed fwd+bwd", "fp32", "fp32 tf32"]
    rates: dict[str, list[float]] = {v: [] for v in variants}
    losses: dict[str, float] = {}
    print(f"GPU {torch.cuda.get_device_name(0)}, torch {torch.__version__}; LeNet, batch "
          f"{args.batch_size}, {args.steps} steps, {args.reps} repetitions")  # fmt: skip
    for rep in range(args.reps):
        for variant in variants if rep % 2 == 0 else reversed(variants):
            try:
                rate, losses[variant] = timed(
                    make_step(variant, args.batch_size, device), args.steps, args.batch_size
                )
            except Exception as exc:  # one variant failing must not hide the others
                print(f"  {variant}: failed: {type(exc).__name__}: {exc}")
                rate = float("nan")
            rates[variant].append(rate)
    plain = statistics.median(rates["plain"])
    for variant in variants:
        median = statistics.median(rates[variant])
        print(f"{variant:>16}: median {median:9.0f} samples/s, {median / plain:5.2f}x plain, "
              f"loss after {args.steps} steps {losses.get(variant, float('nan')):.4f}")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
