"""How a SLURM job ended, and which job the run goes on in, if any.

outcome.py       how a followed job ended: SLURM's last word on it, and the ranks' own
job_attempts.py  the run's attempts: the jobs it took one after another (time limits,
                 preemptions, node faults)
shrink.py        --min-nodes: a job on the nodes left after a loss (pure)
spares.py        --spares: a failed node replaced by submitting the job again
grow_back.py     --min-nodes growing back: a lost node idle again, more nodes at a checkpoint
resubmit.py      the run's next job once one has ended, or none
"""
