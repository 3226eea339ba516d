"""Backends: how the controller reaches a node (local subprocess, SSH) or a scheduler (SLURM).

base.py      what every node backend provides: a connection that can start the node agent
local.py     the local backend: the node is this machine, reached through a subprocess
sessions.py  the controller's side of each node agent
readers.py   the one thread that reads every agent channel it can wait on
open_files.py  room for the descriptors a controller of many nodes holds
scheduler_states.py  an attempt's state as a scheduler reports it, in our words (SchedulerState)
ssh/         the SSH backend: reach every node that `ssh NODE` reaches, with the same trust decision
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.backends.base import NodeConnection
from orchestrator.backends.open_files import allow_open_files
from orchestrator.errors import NodeError
from orchestrator.hosts.hostfile import Cluster
from orchestrator.options.reaching import SshOptions


def connect_cluster(
    cluster: Cluster, ssh_options: SshOptions | None, on_done=None
) -> list[NodeConnection]:
    """A connection to every node: this machine directly, others over SSH in parallel;
    `on_done(ok)` as each node is done (orchestrator.console.progress)."""
    allow_open_files(len(cluster.hosts))
    if cluster.is_local:
        from orchestrator.backends.local import LocalConnection

        return [LocalConnection(host.name) for host in cluster.hosts]
    from orchestrator.backends.ssh import connect_all

    return connect_all(cluster.hosts, ssh_options, on_done)


def connect_each(
    cluster: Cluster, ssh_options: SshOptions | None, on_done=None
) -> tuple[list[NodeConnection | None], dict[int, NodeError]]:
    """As connect_cluster, but a host that cannot be reached gives None and its error (by
    index) instead of failing the whole step."""
    if cluster.is_local:
        return connect_cluster(cluster, ssh_options), {}  # type: ignore[return-value]
    allow_open_files(len(cluster.hosts))
    from orchestrator.backends.ssh import connect_each as connect_each_ssh

    return connect_each_ssh(cluster.hosts, ssh_options, on_done)


def close_all(connections: Sequence[NodeConnection | None]) -> None:
    for connection in connections:
        if connection is None:
            continue
        try:
            connection.close()
        except Exception:  # closing must never hide the real outcome
            pass
