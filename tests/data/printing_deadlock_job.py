"""Ranks that keep printing whether or not they make progress: every rank joins a gloo
group, prints "ready" with the time, and starts a daemon thread that prints a line every 2 s
(a memory logger's habit).

With DEADLOCK_RANK set, that rank's main thread then takes a threading.Lock it already
holds and waits for ever, and every other rank's main thread waits in an all_reduce for it.
Without it, every main thread computes in its own code and all_reduces, step after step, for
WORK_S seconds (40 by default), and the job ends."""

import os
import threading
import time

import torch
import torch.distributed as dist


def report_memory():
    while True:
        print("memory", torch.cuda.is_available(), flush=True)
        time.sleep(2)


def take_the_lock_twice(lock):
    lock.acquire()
    lock.acquire()  # not reentrant: never returns


def work_for(seconds):
    """Steps of work and an all_reduce, as long as every rank is within `seconds` (decided
    together, so that all ranks take the same number of steps)."""
    tensor, end = torch.ones(1), time.time() + seconds
    going = torch.ones(1)
    while going.item():
        tensor += sum(i * i for i in range(100_000)) % 7
        dist.all_reduce(tensor)
        going = torch.tensor([float(time.time() < end)])
        dist.all_reduce(going, op=dist.ReduceOp.MIN)


dist.init_process_group("gloo")
print("ready", time.time(), flush=True)
threading.Thread(target=report_memory, name="memory-logger", daemon=True).start()
if os.environ.get("DEADLOCK_RANK"):
    if dist.get_rank() == int(os.environ["DEADLOCK_RANK"]):
        take_the_lock_twice(threading.Lock())
    dist.all_reduce(torch.ones(1))
else:
    work_for(float(os.environ.get("WORK_S", "40")))
    print("worked", flush=True)
dist.destroy_process_group()  # gloo may abort at exit without it (torch 2.13)
