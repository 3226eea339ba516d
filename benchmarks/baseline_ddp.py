"""A plain, hand-written DDP training loop: the yardstick for the bundled trainer.

This is the loop most tutorials teach: a TensorDataset, DistributedSampler and a
DataLoader with the default collate, DDP around the model. The loss is summed on the
device and read (one GPU sync) only every --log-every steps, the trainer's own default
cadence, because ``loss.item()`` each step would stall a GPU run on every step and make
the yardstick slower than a careful hand-written loop.
It trains the same model on the same synthetic data as ``python -m orchestrator.trainer``
(it imports both from the trainer package so the comparison is like for like).

    torchrun --nproc_per_node=2 benchmarks/baseline_ddp.py --steps 300 --batch-size 32

Last line: ``baseline done: STEPS steps, N samples/s, data wait P%``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from orchestrator.trainer.datasets import make_synthetic
from orchestrator.trainer.models import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU mode)")
    parser.add_argument(
        "--log-every", type=int, help="read and print the loss every N steps (default: steps/10)"
    )
    args = parser.parse_args()

    cuda = args.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    data = make_synthetic(args.samples, images=args.model == "cnn", seed=args.seed)
    dataset = TensorDataset(data.train.inputs, data.train.labels)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, pin_memory=cuda)

    torch.manual_seed(args.seed)
    model = build_model(args.model, data.sample_shape, data.num_classes).to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    # The trainer's default: about ten progress lines per run.
    log_every = args.log_every or max(1, args.steps // 10)
    step, data_wait = 0, 0.0
    loss_sum, window = torch.zeros((), device=device), 0
    start = time.perf_counter()
    epoch = 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        batches = iter(loader)
        while step < args.steps:
            t0 = time.perf_counter()
            try:
                x, y = next(batches)
            except StopIteration:
                break
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            data_wait += time.perf_counter() - t0
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            step, window = step + 1, window + 1
            if step % log_every == 0 or step == args.steps:
                mean_loss = loss_sum.item() / window  # the one sync per window, every rank
                if rank == 0:
                    print(f"step {step} loss {mean_loss:.4f}", flush=True)
                loss_sum.zero_()
                window = 0
        epoch += 1
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if rank == 0:
        samples_per_s = args.steps * args.batch_size * world / elapsed
        print(
            f"baseline done: {args.steps} steps, {samples_per_s:.0f} samples/s, "
            f"data wait {data_wait / elapsed:.1%}",
            flush=True,
        )
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
