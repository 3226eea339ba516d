"""The bundled DDP trainer: ``python -m orchestrator.trainer`` (usually under torchrun).

A reference for data-parallel training that users copy from: split-invariant global
batches, gradient accumulation that matches DDP, checkpoints that lose nothing, and a
clean stop on SIGTERM/SIGUSR1. Only ``loop`` and the modules it pulls in import torch;
``cli`` and ``config`` validate arguments first, so bad input fails fast.

__main__.py     entry point for `python -m orchestrator.trainer`
batching.py     which samples each rank and micro-step trains on, and getting them onto the device
channel.py      per-rank timing records for the orchestrator's metrics channel
checkpoint.py   checkpoints that survive a kill at any moment, and resuming from them exactly
config.py       the trainer's validated settings and process topology (pure: no torch import)
datasets.py     datasets held as whole tensors: synthetic, CIFAR-10 (python pickle format) and .npz
distributed.py  process group setup and the few collectives the trainer needs
entry.py        command line of `python -m orchestrator.trainer`: parse, validate, then train
exits.py        errors the trainer reports to a user as one line
gradients.py    A step's gradient as the exact sum of its blocks' gradients, on any world
graphs.py       the model's forward and backward on a GPU, recorded once as CUDA graphs and replayed
loop.py         the training loop: accumulation that matches DDP, reports, checkpoints, agreed stops
models.py       the models the trainer can build, by name
placement.py    where each rank runs: its local rank on its node, and the device it trains on
reporting.py    what the trainer prints and records: rank-0 progress lines and per-rank JSON metrics
setup.py        everything built before the first step
signals.py      catching stop signals during training, and ending at a step all ranks agree on
split.py        how one global batch is divided over the ranks and their micro-steps (pure)
"""
