"""Talking to SLURM: its client commands, here or on a login node, and what they print.

client.py     sbatch, squeue, scontrol, sacct, sinfo and scancel, run here or over SSH
parse.py      what they print, read (pure)
exec_step.py  `orchestrator exec --run RUN`: a command on every node, as a step of the job
"""
