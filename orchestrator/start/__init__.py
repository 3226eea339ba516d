"""Launching a job: options and preflight, the node pool (spares and recovery), starting in
the background (--detach), and the launcher, where the stages of one attempt meet.

attempt.py         the stages of one attempt of a launch, each given what it needs
detach.py          A detached controller
hostfile_watch.py  A hostfile edited during a --min-nodes run
joining.py         --min-nodes growing back, the node pool's side
launch_backend.py  what a launch backend is (Backend): render, launch, start detached, poll, stop
launcher.py        launch a job
pool.py            the node pool of every launch
preflight.py       before anything starts
regrow.py          --min-nodes growing back
settings.py        A launch's settings beyond the job spec
ssh_backend.py     the ssh and local Backends: a run started and followed over SSH
sync.py            --sync: the directory copied into every node's run folder before the job starts
"""
