"""The path check: before anything starts, every node proves the TCP paths the job will use
(to the master's store port, and to its peers on the NCCL/gloo interface). The node side is
orchestrator/agent/programs/reach.py; which pairs are tried, pairs.py; what was found, found.py;
how it is run through the node agents, prove.py.

in_probe.py  the path check folded into the preflight probe
"""
