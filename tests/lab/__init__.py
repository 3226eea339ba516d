"""The test lab: a real multi-node cluster on this machine (namespaces, sshd, SLURM).

See cluster.py for the node layout, slurm.py for the SLURM side, fixtures.py for pytest;
local_srun.py stands in for srun's one step where the launcher's side is tested alone.
"""

from __future__ import annotations

from tests.lab.cluster import Cluster, Node, make_cluster
from tests.lab.faults import Block, Proc
from tests.lab.packages import LabUnavailable, ensure_prerequisites
from tests.lab.slurm import SlurmCluster, make_slurm
from tests.lab.ssh import known_hosts_line, wrong_host_key

__all__ = [
    "Block",
    "Cluster",
    "LabUnavailable",
    "Node",
    "Proc",
    "SlurmCluster",
    "ensure_prerequisites",
    "known_hosts_line",
    "make_cluster",
    "make_slurm",
    "wrong_host_key",
]
