"""Backends: how the controller reaches a node (local subprocess, SSH) or a scheduler (SLURM)."""
