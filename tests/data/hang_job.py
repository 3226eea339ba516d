"""A hung job: every rank joins a gloo group and prints "ready"; rank STUCK_RANK (from the
environment) then waits forever in a function of its own, and every other rank waits in an
all_reduce for it."""

import os
import time

import torch
import torch.distributed as dist


def wait_for_a_batch_that_never_comes():
    while True:
        time.sleep(0.5)


dist.init_process_group("gloo")
print("ready", flush=True)
if dist.get_rank() == int(os.environ["STUCK_RANK"]):
    wait_for_a_batch_that_never_comes()
tensor = torch.ones(1)
dist.all_reduce(tensor)
print("reduced", tensor.item(), flush=True)
dist.destroy_process_group()  # gloo may abort at exit without it (torch 2.13)
