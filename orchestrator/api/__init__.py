"""Acting on runs from any shell or program: stopping a run (stop.py), taking every
rank's stacks (rank_stacks.py).

launching.py    launching, as a Python program and the command line both do it
node_tasks.py   the commands that look after the nodes rather than run a job: `check` and `clean`
registry.py     the launch backends by name: the one place a name becomes its Backend
request.py      what a launch's options make: the cluster, the job's spec, the run's settings
run_handle.py   A run, as a Python program holds it
shown.py        what the command line shows of runs, as it takes it from the stages below
taking_over.py  A new controller for a SLURM run whose own is gone (orchestrator.slurm.attach)
"""
