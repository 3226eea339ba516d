"""--bind-cores: disjoint core sets per local rank, from a node's own topology.

Like DeepSpeed's --bind_cores_to_rank: the cores this process may run on
(`os.sched_getaffinity`) are ordered by NUMA node (`/sys/devices/system/node/node*/cpulist`)
and cut into one contiguous, disjoint share per local rank (the first `cores % ranks`
ranks get one more); a share that lies within one NUMA node is also bound to that node's
memory (numactl, where installed). More local ranks than cores is refused: sharing cores
is what binding is meant to stop.

Standard library only, and no imports from the package: this file also runs on the nodes
as it is (`python - topology` in the preflight probe, `python - sets N` in a node script
rendered without a probe), so the plan and the scripts compute the same sets.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

NODE_DIR = "/sys/devices/system/node"


@dataclass(frozen=True)
class Topology:
    """The cores a node lets us use, and its NUMA nodes (id -> cores)."""

    cpus: tuple[int, ...]
    numa: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def encode(self) -> str:
        """`0-7|0:0-3;1:4-7`: one line for the probe's key=value output."""
        nodes = ";".join(f"{n}:{format_cpus(c)}" for n, c in self.numa)
        return f"{format_cpus(self.cpus)}|{nodes}"

    @classmethod
    def decode(cls, text: str) -> Topology:
        cpus, _, nodes = text.partition("|")
        numa = []
        for item in filter(None, nodes.split(";")):
            node, _, node_cpus = item.partition(":")
            numa.append((int(node), parse_cpus(node_cpus)))
        return cls(parse_cpus(cpus), tuple(numa))


@dataclass(frozen=True)
class CoreSet:
    """One local rank's cores, and its NUMA node when the cores lie within one."""

    cpus: tuple[int, ...]
    numa_node: int | None = None

    def encode(self) -> str:
        """`0-3` or `0-3/0`: one word of ORCHESTRATOR_CORE_SETS (read by run_rank)."""
        suffix = f"/{self.numa_node}" if self.numa_node is not None else ""
        return format_cpus(self.cpus) + suffix

    def describe(self) -> str:
        where = f" (NUMA node {self.numa_node})" if self.numa_node is not None else ""
        return f"cores {format_cpus(self.cpus)}{where}"


class TooFewCores(ValueError):
    """More local ranks than cores to give them."""


def parse_cpus(text: str) -> tuple[int, ...]:
    """`0-3,8,10-11` (the kernel's cpulist format) -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: list[int] = []
    for item in filter(None, text.strip().split(",")):
        lo, _, hi = item.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(set(cpus)))


def format_cpus(cpus: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 3, 8) -> `0-3,8`: what taskset -c and numactl -C take."""
    ranges: list[str] = []
    ordered = sorted(cpus)
    start = prev = None
    for cpu in ordered + [None]:
        if start is not None and (cpu is None or cpu != prev + 1):
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if cpu is not None and start is None:
            start = cpu
        prev = cpu
    return ",".join(ranges)


def read_topology(node_dir: str = NODE_DIR) -> Topology:
    """This machine's usable cores and NUMA nodes (none listed when sysfs has none)."""
    allowed = set(os.sched_getaffinity(0))
    numa = []
    try:
        names = os.listdir(node_dir)
    except OSError:
        names = []
    for name in names:
        if name.startswith("node") and name[4:].isdigit():
            try:
                with open(os.path.join(node_dir, name, "cpulist")) as f:
                    cpus = tuple(c for c in parse_cpus(f.read()) if c in allowed)
            except OSError:
                continue
            if cpus:
                numa.append((int(name[4:]), cpus))
    return Topology(tuple(sorted(allowed)), tuple(sorted(numa)))


def core_sets(topology: Topology, nproc: int) -> tuple[CoreSet, ...]:
    """One disjoint share of the cores per local rank; raises TooFewCores."""
    if nproc > len(topology.cpus):
        raise TooFewCores(
            f"{nproc} local ranks but only {len(topology.cpus)} usable core(s) "
            f"({format_cpus(topology.cpus)}); run at most "
            f"{len(topology.cpus)} ranks on this node or leave out --bind-cores"
        )
    node_of = {cpu: node for node, cpus in topology.numa for cpu in cpus}
    # NUMA node by node, so that contiguous shares stay within a node where they can.
    ordered = sorted(topology.cpus, key=lambda cpu: (node_of.get(cpu, -1), cpu))
    share, extra = divmod(len(ordered), nproc)
    sets, start = [], 0
    for local_rank in range(nproc):
        size = share + (1 if local_rank < extra else 0)
        cpus = tuple(ordered[start : start + size])
        start += size
        nodes = {node_of.get(cpu) for cpu in cpus}
        node = nodes.pop() if len(nodes) == 1 else None
        sets.append(CoreSet(cpus, node))
    return tuple(sets)


def main(argv: list[str]) -> int:
    """`topology`: print `cores_topology=...`; `sets N`: print the N ranks' sets, one line."""
    topology = read_topology()
    if argv[:1] == ["topology"]:
        print(f"cores_topology={topology.encode()}")
        return 0
    try:
        sets = core_sets(topology, int(argv[1]))
    except TooFewCores as exc:
        print(f"orchestrator: error: --bind-cores: {exc}", file=sys.stderr)
        return 2
    print(" ".join(s.encode() for s in sets))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
