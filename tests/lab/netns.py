"""Nodes as network namespaces: veth pairs on a bridge, addresses, /etc/hosts names.

Node i of cluster k is the namespace `olab<k>-node<i>` (also its host name in /etc/hosts and
its SLURM NodeName), whose `eth0` holds the (2+i)th address of the cluster's /23 (state.py);
the outer veth end `olab<k>v<i>` sits on the bridge `olab<k>br`, which holds the first, named
`olab<k>-controller`, for the controller (the root namespace). Every interface name stays
within Linux's 15 characters.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.lab import state
from tests.lab.ssh import new_key

FIRST_NODE_HOST = 2
# every address of the subnet but the network's, the bridge's and the broadcast: 509 for a /23
MAX_NODES = 2 ** (32 - state.PREFIX) - 3


@dataclass(frozen=True)
class Node:
    """One namespace node: `name` is its host name, namespace name and SLURM NodeName."""

    index: int
    name: str
    address: str
    netns: str
    veth: str  # the outer end, on the bridge in the root namespace
    dir: Path  # its sshd config, host key, pid file and log
    host_public_key: str  # 'ssh-ed25519 AAAA...'
    interface: str = "eth0"

    @property
    def cidr(self) -> str:
        """Its address with the cluster's prefix length, as `ip addr` shows it."""
        return f"{self.address}/{state.PREFIX}"

    @property
    def sshd_config_path(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def sshd_pid_path(self) -> Path:
        return self.dir / "sshd.pid"

    @property
    def sshd_log_path(self) -> Path:
        return self.dir / "sshd.log"


def node_address(net: ipaddress.IPv4Network, i: int) -> str:
    """Node i's address in its cluster's subnet."""
    return str(net.network_address + FIRST_NODE_HOST + i)


def bridge_address(record: state.ClusterState) -> str:
    return str(state.subnet_of(record.index).network_address + 1)


def controller_name(record: state.ClusterState) -> str:
    return f"{record.name}-controller"


def plan_nodes(record: state.ClusterState, n: int, workdir: Path) -> tuple[Node, ...]:
    """Names, addresses and fresh host keys (written under `workdir`) for `n` nodes."""
    if not 1 <= n <= MAX_NODES:
        raise ValueError(f"a lab cluster has 1..{MAX_NODES} nodes, not {n}")
    net = state.subnet_of(record.index)
    nodes = []
    for i in range(n):
        name = f"{record.name}-node{i}"
        node_dir = workdir / "nodes" / name
        node_dir.mkdir(parents=True)
        host_key = new_key()
        host_key.write(node_dir / "ssh_host_ed25519_key", comment=name)
        address = node_address(net, i)
        nodes.append(Node(i, name, address, name, f"{record.name}v{i}", node_dir, host_key.public))
    return tuple(nodes)


def _ip_batch(commands: Sequence[str], netns: str | None = None) -> None:
    """Run `ip` commands in one process (`-n NS` applies them inside a namespace)."""
    argv = ["ip", *(["-n", netns] if netns else []), "-batch", "-"]
    done = subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


def build_network(record: state.ClusterState, nodes: Sequence[Node]) -> dict[str, int]:
    """Create bridge, namespaces, veths, addresses and the /etc/hosts block.

    Everything is recorded in `record` before it is created, so that a crash half-way is
    still cleaned up. Returns each namespace's inode (to find its processes later).
    """
    record.namespaces = [n.netns for n in nodes]
    record.links = [n.veth for n in nodes]
    record.save()
    bridge = record.bridge
    root = [
        f"link add {bridge} type bridge",
        f"addr add {bridge_address(record)}/{state.PREFIX} dev {bridge}",
        f"link set {bridge} up",
    ]
    for node in nodes:
        root += [
            f"netns add {node.netns}",
            f"link add {node.veth} type veth peer name {node.interface} netns {node.netns}",
            f"link set {node.veth} master {bridge} up",
        ]
    _ip_batch(root)
    for node in nodes:
        inner = [
            "link set lo up",
            f"addr add {node.cidr} dev {node.interface}",
            f"link set {node.interface} up",
        ]
        _ip_batch(inner, netns=node.netns)
    hosts = [(bridge_address(record), controller_name(record))]
    state.add_hosts_block(record, hosts + [(n.address, n.name) for n in nodes])
    return {n.netns: state.netns_inode(n.netns) or 0 for n in nodes}


def set_link(link: str, up: bool) -> None:
    """Set a root-namespace link (a node's outer veth end) up or down."""
    done = subprocess.run(
        ["ip", "link", "set", link, "up" if up else "down"], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"ip link set {link} failed: {done.stderr.strip()}")
