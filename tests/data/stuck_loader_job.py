"""A hung job whose stuck rank waits on its DataLoader: every rank joins a gloo group and
prints "ready"; rank STUCK_RANK (from the environment) then iterates a DataLoader with one
worker whose Dataset reads a pipe nobody writes (the worker, forked, inherits both ends, so
its read blocks for ever and nothing is left on disk), and every other rank waits in an
all_reduce for it."""

import os

import torch
import torch.distributed as dist


class PipeDataset(torch.utils.data.Dataset):
    def __init__(self, fd):
        self.fd = fd

    def __len__(self):
        return 4

    def __getitem__(self, index):
        data = os.read(self.fd, 1)  # nobody writes: blocks for ever
        return torch.tensor(len(data))


def train(loader):
    for batch in loader:
        print("batch", batch, flush=True)


dist.init_process_group("gloo")
print("ready", flush=True)
if dist.get_rank() == int(os.environ["STUCK_RANK"]):
    read_end, _write_end = os.pipe()
    train(torch.utils.data.DataLoader(PipeDataset(read_end), num_workers=1))
tensor = torch.ones(1)
dist.all_reduce(tensor)
print("reduced", tensor.item(), flush=True)
dist.destroy_process_group()  # gloo may abort at exit without it (torch 2.13)
