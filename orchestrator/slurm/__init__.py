"""The SLURM backend: one sbatch job for the whole run.

sbatch.py holds the SLURM flags, planning.py turns them and the spec into the job (job.py,
with what plan.yaml says of it) and batch_script.py the job into job.sbatch (all pure);
client.py runs sbatch, squeue, sacct and scancel, here or on a login node, and parse.py reads
what they print (pure); submit.py writes the run record and submits; follow.py follows the
job to its end, streaming the ranks' output like the SSH path.
"""
