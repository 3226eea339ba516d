"""The SLURM backend: one sbatch job for the whole run.

sbatch.py turns the spec into job.sbatch (pure); client.py runs sbatch, squeue, sacct and
scancel, here or on a login node, and parse.py reads what they print (pure); submit.py writes
the run record and submits; follow.py follows the job to its end, streaming the ranks' output
like the SSH path.
"""
