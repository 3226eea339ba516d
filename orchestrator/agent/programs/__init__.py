"""Programs shipped to the nodes as source and run there on their own, standard library
only and importing nothing of the package (the agent imports route.py too).

reach.py  the path check: do the job's TCP paths work (store and peers)
route.py  which interface reaches an address, read from the kernel, where `ip` is missing
cores.py  --bind-cores: disjoint core sets per local rank, from a node's own topology
dial.py   under SLURM: each node's part of the launcher's one step to the agents
"""
