"""Rank 1 hangs (sleeps for ever) in the workers' first attempt only; in torchrun's next
(--max-restarts) every rank all_reduces and prints the sum."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
print("attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], flush=True)
if dist.get_rank() == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    while True:
        time.sleep(0.5)
tensor = torch.ones(1)
dist.all_reduce(tensor)
print("reduced", tensor.item(), flush=True)
dist.destroy_process_group()  # gloo may abort at exit without it (torch 2.13)
