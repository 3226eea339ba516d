"""Fault injection on the namespace network, and the process table seen per node.

Blocking uses only iproute2 (no iptables/nft package): `ip rule ... prohibit|unreachable|
blackhole` in the sender's namespace makes connect() fail at once (EACCES, EHOSTUNREACH,
EINVAL), optionally for one TCP port; mode "drop" installs a permanent neighbour entry with
a MAC no one owns, so packets leave and vanish and connections time out like behind a
silent firewall (all ports of that address). The kernel here has no u32/gact traffic
control modules, so `tc` cannot drop by port.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.lab import state

if TYPE_CHECKING:
    from tests.lab.cluster import Cluster
    from tests.lab.netns import Node

RULE_MODES = ("prohibit", "unreachable", "blackhole")
DROP_MODE = "drop"
# Locally administered, documentation-like MAC that no lab interface carries.
NOWHERE_MAC = "02:00:5e:00:53:01"


@dataclass(frozen=True)
class Proc:
    """A live process seen inside a node's namespace."""

    pid: int
    node: str
    cmdline: tuple[str, ...]
    exe: str | None  # None when the kernel hides it (kernel threads, races)

    @property
    def command(self) -> str:
        return " ".join(self.cmdline)

    def environ(self) -> dict[str, str]:
        """The process's initial environment (empty if it has exited meanwhile)."""
        try:
            raw = Path(f"/proc/{self.pid}/environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return {}
        pairs = (item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if item)
        return {p[0]: p[1] for p in pairs if len(p) == 2}

    def has_env(self, name: str, value: str | None = None) -> bool:
        env = self.environ()
        return name in env and (value is None or env[name] == value)

    def alive(self) -> bool:
        return state.process_start(self.pid) is not None


def processes_in(netns: str, node_name: str) -> list[Proc]:
    """Live processes whose network namespace is `netns` (all nodes share one pid namespace)."""
    inode = state.netns_inode(netns)
    if inode is None:
        return []
    found: list[Proc] = []
    for pid in state.pids_in_netns(inode):
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        try:
            exe: str | None = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = None
        cmdline = tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)
        found.append(Proc(pid, node_name, cmdline, exe))
    return found


def _ip(netns: str | None, *args: str) -> None:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


@dataclass(frozen=True)
class Block:
    """One installed block: traffic from `src` (None: controller) to `dst` [tcp `port`]."""

    src: str | None
    dst: str
    port: int | None
    mode: str
    netns: str | None  # where the rule lives (None: root namespace)
    args: tuple[str, ...]  # `ip rule` or `ip neigh` arguments after add/replace


def add_block(cluster: Cluster, src: Node | None, dst: Node, port: int | None, mode: str) -> Block:
    """Install a block; rules in the root namespace are recorded for stale-cluster cleanup."""
    netns = src.netns if src is not None else None
    args: tuple[str, ...]
    if mode == DROP_MODE:
        if port is not None:
            raise ValueError("mode 'drop' blocks every port of an address; use a rule mode")
        device = "eth0" if src is not None else cluster.bridge
        args = (dst.address, "lladdr", NOWHERE_MAC, "dev", device, "nud", "permanent")
        _ip(netns, "neigh", "replace", *args)
    elif mode in RULE_MODES:
        args = ("to", f"{dst.address}/32")
        if port is not None:
            args += ("ipproto", "tcp", "dport", str(port))
        args += (mode,)
        if netns is None:
            cluster.state.root_rules.append(list(args))
            cluster.state.save()
        _ip(netns, "rule", "add", *args)
    else:
        raise ValueError(f"mode must be one of {(*RULE_MODES, DROP_MODE)}, not {mode!r}")
    return Block(src.name if src else None, dst.name, port, mode, netns, args)


def remove_block(cluster: Cluster, block: Block) -> None:
    if block.mode == DROP_MODE:
        address, device = block.args[0], block.args[4]
        _ip(block.netns, "neigh", "del", address, "dev", device)
        return
    _ip(block.netns, "rule", "del", *block.args)
    if block.netns is None:
        cluster.state.root_rules.remove(list(block.args))
        cluster.state.save()
