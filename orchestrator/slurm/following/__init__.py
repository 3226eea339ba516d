"""Following a submitted SLURM job to its end, as `launch --backend slurm` shows it.

follow.py       the follower: squeue, the node agents and the nodes' files into one stream
cadence.py      how often it asks squeue and reads the nodes' files
agents.py       the way to a node's agent: an `srun --overlap` step of the job
node_agents.py  the attempt's node agents, as the follower hears them
stream.py       the files of nodes whose agent is not reached, into the log stream
handover.py     what the follower leaves in the run record for a controller taking over
"""
