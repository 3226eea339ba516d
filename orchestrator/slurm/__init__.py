"""The SLURM backend: one sbatch job for the whole run.

planning.py turns the SLURM group (options/scheduler.py) and the spec into the job (job.py,
with what plan.yaml says of it) and batch_script.py the job into job.sbatch, whose task on
every node is the node agent (all pure); client.py runs sbatch, squeue, sacct and scancel,
here or on a login node, and parse.py reads what they print (pure); submit.py writes the run
record and submits; follow.py follows the job to its end, streaming the ranks' output like
the SSH path, and agents.py reaches the node agents through srun --overlap.
"""
