"""Planning: hosts + spec (+ what the preflight probe found) -> a `LaunchPlan`. Pure.

No network, no files: everything the plan needs to know about the nodes comes in as
`NodeFacts` from the explicit probe step, so this is tested exhaustively without a
cluster and `--dry-run` shows exactly what would run. Every choice carries its reason.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.agent.programs.cores import CoreSet, TooFewCores, Topology, core_sets
from orchestrator.agent.runtime import NAMED  # the runtimes whose containers have names
from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import LOCAL_NAMES, Cluster, Host
from orchestrator.hosts.selection import slot_count
from orchestrator.plan.container import AUTO, ContainerSpec, container_name
from orchestrator.plan.spec import DEFAULT_MASTER_PORT, VISIBLE_DEVICES, JobSpec, Program

IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
LAUNCH_WORLD_SIZE = "ORCHESTRATOR_LAUNCH_WORLD_SIZE"
NODE_RUNS_DIR = ".orchestrator/runs"  # in the node's home: one folder per run


def node_dir(run_id: str, node_rank: int, attempt: int = 1) -> str:
    """Where a node keeps its script, rank output and synced code (`~` is the node's home).

    A relaunch after a node fault (--spares) is attempt 2, 3, ...: each keeps its own
    folder, so no attempt's output overwrites an earlier one's on the same node."""
    run = f"~/{NODE_RUNS_DIR}/{run_id}"
    return f"{run}/node{node_rank}" if attempt == 1 else f"{run}/attempt{attempt}/node{node_rank}"


def launch_world_env(ranks_per_node: Sequence[int]) -> tuple[str, str]:
    """ORCHESTRATOR_LAUNCH_WORLD_SIZE for every rank: the ranks the run was launched with
    (each node's ranks at launch, summed). A run that goes on with fewer nodes (--min-nodes)
    keeps it while WORLD_SIZE shrinks, so a program can keep its global batch."""
    return LAUNCH_WORLD_SIZE, str(sum(ranks_per_node))


@dataclass(frozen=True)
class NodeFacts:
    """What the preflight probe learned about one node (all optional)."""

    address: str | None = None  # the address the controller reached it at
    ifname: str | None = None  # interface whose route reaches MASTER_ADDR
    route_source: str | None = None  # local address of that route
    python_version: str | None = None
    torch_version: str | None = None
    free_port: int | None = None  # master only: the port chosen as free
    port_checked: bool = False  # master only: the explicit port was found free
    topology: Topology | None = None  # usable cores and NUMA nodes (probed for --bind-cores)
    container_runtime: str | None = None  # --container-runtime auto: the one found there
    addresses: tuple[tuple[str, str], ...] = ()  # every interface's IPv4 address but lo's

    def address_of(self, ifname: str | None) -> str | None:
        """The IPv4 address NCCL/gloo bind on `ifname` here (the route's when not known)."""
        return dict(self.addresses).get(ifname or "") or self.route_source


@dataclass(frozen=True)
class NodePlan:
    """One node's part: its rank, its ranks, its interpreter, interface and env."""

    node_rank: int
    host: Host
    nproc: int
    rank_start: int
    python: str
    ifname: str | None
    ifname_reason: str
    env: tuple[tuple[str, str], ...]  # exported by the node script (no secrets)
    workdir: str  # where the ranks start; `~/...` is relative to the node's home
    node_dir: str
    bind_cores: bool = False  # --bind-cores: each local rank on cores of its own
    core_sets: tuple[CoreSet, ...] | None = None  # by local rank; None: computed at start
    container_runtime: str = AUTO  # with --container: auto (chosen at start) or the runtime
    container_name: str = ""  # with --container under docker/podman: stopped by this name

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def ranks(self) -> range:
        return range(self.rank_start, self.rank_start + self.nproc)

    @property
    def is_local(self) -> bool:
        return self.host.is_local


@dataclass(frozen=True)
class LaunchPlan:
    """The whole job, every value decided; rendering and backends only read it."""

    run_id: str
    nodes: tuple[NodePlan, ...]
    master_addr: str
    master_addr_reason: str
    master_port: int
    master_port_reason: str
    program: Program
    secret_names: tuple[str, ...]  # passed to the job at launch, never written down
    sync_dir: str | None = None  # copied into every node's node_dir before the start
    selection: str = ""  # --include/--exclude/--num-nodes/--num-gpus as given
    max_restarts: int = 0  # torchrun's --max-restarts; > 0 means c10d rendezvous
    spares: tuple[str, ...] = ()  # --spares: hosts held back to replace a node that fails
    attempt: int = 1  # 2, 3, ...: relaunched on a spare after a node fault
    container: ContainerSpec | None = None  # --container: torchrun and the ranks in an image

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def world_size(self) -> int:
        return sum(node.nproc for node in self.nodes)

    @property
    def is_local(self) -> bool:
        return all(node.is_local for node in self.nodes)

    def node_of_rank(self, rank: int) -> NodePlan:
        for node in self.nodes:
            if rank in node.ranks:
                return node
        raise KeyError(rank)

    def to_dict(self) -> dict:
        """The plan as plain data for plan.yaml and --dry-run (secret values never appear)."""
        return {
            "run_id": self.run_id,
            "program": self.program.describe(),
            "sync": self.sync_dir,
            "nnodes": self.nnodes,
            "world_size": self.world_size,
            "master_addr": f"{self.master_addr}  # {self.master_addr_reason}",
            "master_port": f"{self.master_port}  # {self.master_port_reason}",
            "secrets": list(self.secret_names),
            **({"selection": self.selection} if self.selection else {}),
            **restarts_entry(self.max_restarts),
            **spares_entry(self.spares),
            **({"attempt": self.attempt} if self.attempt > 1 else {}),
            **container_entry(self.container),
            "nodes": [_node_dict(node, self.container) for node in self.nodes],
        }


def restarts_entry(max_restarts: int) -> dict[str, str]:
    """plan.yaml's line for --max-restarts (none without restarts), for every backend."""
    if not max_restarts:
        return {}
    return {
        "max_restarts": f"{max_restarts}  # torchrun --max-restarts, c10d rendezvous at the master"
    }


def spares_entry(spares: tuple[str, ...]) -> dict[str, list[str]]:
    """plan.yaml's list of --spares hosts, held back to replace a node that fails."""
    return {"spares": list(spares)} if spares else {}


def container_entry(container: ContainerSpec | None) -> dict[str, dict]:
    """plan.yaml's `container:` (none without --container), for every backend."""
    if container is None:
        return {}
    shown: dict[str, object] = {"image": container.image, "runtime": container.runtime}
    if container.mounts:
        shown["mounts"] = [mount.spec() for mount in container.mounts]
    if container.workdir:
        shown["workdir"] = container.workdir
    if container.args:
        shown["args"] = list(container.args)
    shown["python"] = container.python
    return {"container": shown}


def _node_dict(node: NodePlan, container: ContainerSpec | None) -> dict:
    shown = {
        "node_rank": node.node_rank,
        "host": node.name,
        "backend": "local" if node.is_local else "ssh",
        "ranks": f"{node.ranks.start}-{node.ranks.stop - 1}",
        "nproc": node.nproc,
    }
    if node.host.slot_ids is not None:
        shown["slots"] = ",".join(map(str, node.host.slot_ids))
    if node.bind_cores:
        shown["cores"] = (
            {f"local rank {i}": s.describe() for i, s in enumerate(node.core_sets)}
            if node.core_sets is not None
            else "(computed at start from the node's own topology)"
        )
    if container is not None:
        runtime = node.container_runtime
        shown["container"] = (
            f"{runtime}, named {node.container_name}" if node.container_name else runtime
        ) + (" (chosen at start)" if runtime == AUTO else "")
    return {
        **shown,
        "python": container.python if container is not None else node.python,
        "workdir": node.workdir,
        "ifname": f"{node.ifname or '(detected at start)'}  # {node.ifname_reason}",
        "omp_num_threads": omp_threads(node.nproc, node.env),
        "env": dict(node.env),
    }


def omp_threads(nproc: int, env: tuple[tuple[str, str], ...]) -> str:
    """OMP_NUM_THREADS of a node's ranks as plan.yaml shows it: the user's, or the node's
    usable cores shared by its `nproc` local ranks (torchrun's own default, 1, starves CPU
    work). The node script works it out when it starts (templates/_omp_threads.sh.j2)."""
    chosen = dict(env).get("OMP_NUM_THREADS")
    if chosen is not None:
        return f"{chosen}  # given (--env, --env-file or this shell's OMP_* variables)"
    share = "its usable cores" if nproc == 1 else f"its usable cores / {nproc} local ranks"
    return f"(at start: {share}, at least 1)  # unless OMP_NUM_THREADS is set there"


def make_plan(
    cluster: Cluster,
    spec: JobSpec,
    run_id: str,
    facts: Mapping[int, NodeFacts] | None = None,
    attempt: int = 1,
    launched_with: Sequence[int] | None = None,
) -> LaunchPlan:
    """Decide node ranks, ranks, master address/port, interfaces and env for every node.

    `facts` are the preflight probe's, by node rank (two entries may share a host name).
    `launched_with`: each node's ranks when the run was launched (None: this plan is the
    launch), for ORCHESTRATOR_LAUNCH_WORLD_SIZE.
    """
    facts = facts or {}
    hosts = cluster.hosts
    master_addr, addr_reason = _master_addr(cluster, spec, facts)
    master_port, port_reason = _master_port(spec, facts.get(0))
    secret_names = tuple(sorted(name for name, _ in spec.env if spec.is_secret(name)))
    # The plan sets these itself, last; a forwarded copy would only be exported twice.
    own = {"ORCHESTRATOR_RUN_ID", "PYTHONUNBUFFERED", LAUNCH_WORLD_SIZE}
    if any(host.slot_ids is not None for host in hosts):  # the selection's GPUs win
        own.add(VISIBLE_DEVICES)
    common_env = [(k, v) for k, v in spec.env if k not in secret_names and k not in own]

    nprocs = [_nproc(host, spec) for host in hosts]
    launch_world = launch_world_env(nprocs if launched_with is None else launched_with)
    nodes = []
    rank_start = 0
    for node_rank, (host, nproc) in enumerate(zip(hosts, nprocs, strict=True)):
        ifname, ifname_reason = _ifname(host, spec, facts.get(node_rank), master_addr)
        env = list(common_env)
        if host.slot_ids is not None:  # LOCAL_RANK i runs on the i-th chosen slot
            env.append((VISIBLE_DEVICES, ",".join(map(str, host.slot_ids))))
        if ifname:  # an explicit --env NCCL_SOCKET_IFNAME=... is the user's and stays
            env += [(var, ifname) for var in IFNAME_VARS if var not in spec.env_dict]
        env += [("ORCHESTRATOR_RUN_ID", run_id), launch_world, ("PYTHONUNBUFFERED", "1")]
        directory = node_dir(run_id, node_rank, attempt)
        workdir = spec.workdir
        if spec.sync_dir:
            workdir = f"{directory}/{os.path.basename(os.path.normpath(spec.sync_dir))}"
        nodes.append(
            NodePlan(
                node_rank=node_rank,
                host=host,
                nproc=nproc,
                rank_start=rank_start,
                python=host.python or spec.python,
                ifname=ifname,
                ifname_reason=ifname_reason,
                env=tuple(env),
                workdir=workdir,
                node_dir=directory,
                bind_cores=spec.bind_cores,
                core_sets=_core_sets(host, nproc, facts.get(node_rank))
                if spec.bind_cores
                else None,
                **_container_fields(
                    spec.container, run_id, node_rank, attempt, facts.get(node_rank)
                ),
            )
        )
        rank_start += nproc
    return LaunchPlan(
        run_id=run_id,
        nodes=tuple(nodes),
        master_addr=master_addr,
        master_addr_reason=addr_reason,
        master_port=master_port,
        master_port_reason=port_reason,
        program=spec.program,
        secret_names=secret_names,
        sync_dir=spec.sync_dir,
        selection=cluster.selection,
        max_restarts=spec.max_restarts,
        spares=tuple(host.name for host in cluster.spares),
        attempt=attempt,
        container=spec.container,
    )


def _container_fields(
    container: ContainerSpec | None,
    run_id: str,
    node_rank: int,
    attempt: int,
    facts: NodeFacts | None,
) -> dict[str, str]:
    """A node's container runtime (the one asked for, else the probe's find, else `auto`,
    chosen when the script starts) and, for a runtime that names containers, its name."""
    if container is None:
        return {}
    runtime = container.runtime
    if runtime == AUTO and facts is not None and facts.container_runtime:
        runtime = facts.container_runtime
    named = runtime in (AUTO, *NAMED)
    return {
        "container_runtime": runtime,
        "container_name": container_name(run_id, node_rank, attempt) if named else "",
    }


def is_loopback(addr: str) -> bool:
    if addr.lower() in LOCAL_NAMES or addr.startswith("127."):
        return True
    try:  # any spelling of ::1, and ::ffff:127.x.y.z
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _master_addr(
    cluster: Cluster, spec: JobSpec, facts: Mapping[int, NodeFacts]
) -> tuple[str, str]:
    first = cluster.hosts[0]
    multi = len(cluster.hosts) > 1
    if spec.master_addr:
        addr, reason = spec.master_addr, "--master-addr"
    elif first.is_local:
        addr, reason = "127.0.0.1", f"first node {first.name} is this machine"
    else:
        known = facts.get(0)
        if known and known.address:
            addr, reason = known.address, f"address of first node {first.name}, as reached by ssh"
        else:
            addr, reason = first.name, f"first node in {cluster.path}"
    if multi and is_loopback(addr):
        raise ConfigError(
            f"MASTER_ADDR would be {addr} (a loopback address) in a {len(cluster.hosts)}-node "
            f"job: other nodes cannot reach it. List nodes by names or addresses the other "
            f"nodes can reach (not localhost), or pass --master-addr ADDRESS"
        )
    return addr, reason


def _master_port(spec: JobSpec, master_facts: NodeFacts | None) -> tuple[int, str]:
    if spec.master_port is not None:
        checked = master_facts is not None and master_facts.port_checked
        return spec.master_port, (
            "--master-port, checked free on the master"
            if checked
            else "--master-port (not checked)"
        )
    if master_facts is not None and master_facts.free_port is not None:
        return master_facts.free_port, "auto: a port checked free on the master"
    return DEFAULT_MASTER_PORT, "auto, not probed: the default"


def _nproc(host: Host, spec: JobSpec) -> int:
    if host.slot_ids is not None:  # chosen by a selection, --nproc-per-node included
        return len(host.slot_ids)
    return slot_count(host, spec.nproc_per_node)


def _core_sets(host: Host, nproc: int, facts: NodeFacts | None) -> tuple[CoreSet, ...] | None:
    """--bind-cores from the probed topology; None when not probed (the script computes)."""
    if facts is None or facts.topology is None:
        return None
    try:
        return core_sets(facts.topology, nproc)
    except TooFewCores as exc:
        raise ConfigError(f"--bind-cores on {host.name} ({host.source}): {exc}") from None


def _ifname(
    host: Host, spec: JobSpec, facts: NodeFacts | None, master_addr: str
) -> tuple[str | None, str]:
    if host.ifname:
        return host.ifname, f"hostfile ({host.source})"
    if spec.ifname:
        return spec.ifname, "--ifname"
    if facts is not None and facts.ifname:
        via = f" from {facts.route_source}" if facts.route_source else ""
        return facts.ifname, f"probed: {host.name} reaches {master_addr}{via} via {facts.ifname}"
    return None, f"not probed: the node script picks the interface routing to {master_addr}"
