"""The SLURM job and its script, every value decided before anything runs. Pure.

planning.py      the SLURM group and the spec -> the job (`SlurmJob`)
job.py           the job, every value decided, and what plan.yaml says of it
containers.py    --container under SLURM: pyxis's srun flags or apptainer's command
node_files.py    where the nodes keep their files: in the run record, or on the nodes
batch_script.py  the job as job.sbatch, whose task on every node is the node agent
"""
