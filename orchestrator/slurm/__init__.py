"""The SLURM backend: one sbatch job for the whole run.

batch/ turns the SLURM group (options/scheduler.py) and the spec into the job (planning.py,
job.py, with what plan.yaml says of it) and the job into job.sbatch (batch_script.py), whose
task on every node is the node agent (all pure); control/ runs sbatch, squeue, sacct and
scancel, here or on a login node, and reads what they print (client.py, parse.py); submit.py
writes the run record and submits; following/ follows the job to its end, streaming the
ranks' output like the SSH path, and reaches the node agents through srun --overlap;
recovery/ says how a job ended and which job the run goes on in.

submit.py   `launch --backend slurm` and `render --backend slurm`: plan, render, submit, follow
attach.py   `orchestrator attach RUN`: a new controller for a SLURM run whose controller is gone
backend.py  the SLURM Backend (the registry's slurm): render, launch, start detached, poll, stop
batch/      the SLURM job and its script, every value decided before anything runs (pure)
control/    talking to SLURM: its client commands, here or on a login node, and what they print
following/  following a submitted SLURM job to its end, as `launch --backend slurm` shows it
recovery/   how a SLURM job ended, and which job the run goes on in, if any
"""
