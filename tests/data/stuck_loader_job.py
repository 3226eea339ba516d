"""A hung job whose stuck rank waits on its DataLoader: every rank joins a gloo group and
prints "ready"; rank STUCK_RANK (from the environment) then iterates a DataLoader with one
worker whose Dataset reads a named pipe nobody writes (the worker blocks in open()), and
every other rank waits in an all_reduce for it."""

import os
import tempfile

import torch
import torch.distributed as dist


class PipeDataset(torch.utils.data.Dataset):
    def __init__(self, path):
        self.path = path

    def __len__(self):
        return 4

    def __getitem__(self, index):
        with open(self.path, "rb") as pipe:  # nobody writes: blocks for ever
            return torch.tensor(len(pipe.read()))


def train(loader):
    for batch in loader:
        print("batch", batch, flush=True)


dist.init_process_group("gloo")
print("ready", flush=True)
if dist.get_rank() == int(os.environ["STUCK_RANK"]):
    fifo = os.path.join(tempfile.mkdtemp(), "never-written")
    os.mkfifo(fifo)
    train(torch.utils.data.DataLoader(PipeDataset(fifo), num_workers=1))
tensor = torch.ones(1)
dist.all_reduce(tensor)
print("reduced", tensor.item(), flush=True)
dist.destroy_process_group()  # gloo may abort at exit without it (torch 2.13)
