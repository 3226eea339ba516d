"""A run's attempts: what follows one, decided once for every backend from typed facts of
the attempt that ended; the backend carries it out (over SSH start/pool.py and
start/regrow.py, under SLURM slurm/recovery/: a spare probed and joined, or a job
submitted again).

next_attempt.py    the decision: a spare in, a node left out, growing back, the same again, the end
"""
