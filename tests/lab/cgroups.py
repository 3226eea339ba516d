"""Nodes apart from the controller: a control group for the nodes' processes.

On a real cluster every node has CPUs and memory of its own; in the lab every node shares
the controller's machine. At a few nodes that does not matter. At 250 the nodes' torch
imports (~40 GB here, on 24 GB of memory) pushed the controller itself out to swap: its
threads stood still for 500 s (a thread that only slept 10 s at a time did not run once in
that time; 9 000 major page faults), so its nodes heard nothing from it and stopped. That is
the lab failing, not the launcher it tests.

`Group` moves node sshds, and so everything later started through them, into a cgroup
whose memory the kernel reclaims first (soft limit 0: when memory runs short the nodes
swap, the controller keeps its pages; a hard cap was tried and made the nodes thrash among
themselves: 43 of 250 had started after 12 minutes) and whose CPU share is that of one busy
process outside it (the kernel still gives the nodes every cycle nobody else wants).
Benchmarks at scale use it; pdsh, ssh and the controller, which all run outside it, are
measured alike. cgroup v1 (this kind of machine: cpu and memory hierarchies) only; elsewhere
`Group.create` says why it cannot.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

CONTROLLERS = ("memory", "cpu")
ACCOUNTING = "cpuacct"  # where mounted: the CPU time the nodes used (benchmarks read it)


class Unavailable(Exception):
    """This machine cannot put the nodes in a cgroup of their own (the message says why)."""


def _v1_mounts() -> dict[str, Path]:
    """Where each cgroup v1 controller's hierarchy is mounted."""
    mounts: dict[str, Path] = {}
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, where, kind, options, *_ = line.split()
        if kind == "cgroup":
            for option in options.split(","):
                mounts.setdefault(option, Path(where))
    return mounts


def _own_paths() -> dict[str, str]:
    """This process's cgroup in each v1 hierarchy (/proc/self/cgroup)."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


class Group:
    """One cgroup per controller (CONTROLLERS), under this process's own."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs
        self.accounting: Path | None = None  # its cpuacct folder, where there is one (create)

    @classmethod
    def create(cls, name: str) -> Group:
        mounts, own = _v1_mounts(), _own_paths()
        missing = [c for c in CONTROLLERS if c not in mounts or c not in own]
        if missing:
            raise Unavailable(f"no cgroup v1 hierarchy for {', '.join(missing)}")
        group = cls([mounts[c] / own[c].lstrip("/") / name for c in CONTROLLERS])
        if ACCOUNTING in mounts and ACCOUNTING in own:
            group.accounting = mounts[ACCOUNTING] / own[ACCOUNTING].lstrip("/") / name
            if group.accounting not in group.dirs:  # cpu and cpuacct may share a hierarchy
                group.dirs.append(group.accounting)
        try:
            for path in group.dirs:
                path.mkdir()
            (group.dirs[0] / "memory.soft_limit_in_bytes").write_text("0\n")
        except OSError as exc:
            group.remove()
            raise Unavailable(f"cannot set up a cgroup: {exc}") from None
        return group

    def add(self, pid: int) -> None:
        """Move `pid` in; what it starts from now on stays in."""
        for path in self.dirs:
            (path / "cgroup.procs").write_text(f"{pid}\n")

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) the processes in the group have used so far, ended ones
        included; None where this machine does not account it."""
        if self.accounting is None:
            return None
        return int((self.accounting / "cpuacct.usage").read_text()) / 1e9

    def remove(self, timeout: float = 5.0) -> None:
        """Delete the cgroups once the processes in them are gone."""
        remove_dirs(self.dirs, timeout)


def remove_dirs(dirs: list[Path], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    for path in dirs:
        while path.is_dir():
            with contextlib.suppress(OSError):
                os.rmdir(path)
            if not path.is_dir() or time.monotonic() > deadline:
                break
            time.sleep(0.05)
