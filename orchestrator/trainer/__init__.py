"""The bundled DDP trainer: ``python -m orchestrator.trainer`` (usually under torchrun).

A reference for data-parallel training that users copy from: split-invariant global
batches, gradient accumulation that matches DDP, checkpoints that lose nothing, and a
clean stop on SIGTERM/SIGUSR1. Only ``loop`` and the modules it pulls in import torch;
``cli`` and ``config`` validate arguments first, so bad input fails fast.
"""
