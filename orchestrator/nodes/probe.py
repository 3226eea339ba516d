"""The preflight probe: before anything starts, ask every node (in parallel) for its python
and torch, the interface that routes to MASTER_ADDR, and (on the master) a free port.

This is the explicit, separate step of the data flow that touches the nodes; its result,
`NodeFacts` per host, is what planning gets. A problem on any node stops the launch
before anything has started anywhere.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from orchestrator.agent.programs.cores import Topology
from orchestrator.backends.base import MISSING_PYTHON_WORDS, NodeConnection
from orchestrator.console.progress import Progress
from orchestrator.errors import NodeError, NodeErrors
from orchestrator.hostlist import compress_hosts
from orchestrator.hosts.hostfile import Cluster
from orchestrator.nodes.execute import run_on_nodes
from orchestrator.options.running import RunOptions
from orchestrator.plan.container import ContainerSpec
from orchestrator.plan.launch_plan import NodeFacts
from orchestrator.plan.scripts import render_template
from orchestrator.plan.spec import JobSpec
from orchestrator.record.states import NodePhase
from orchestrator.sizes import format_size, human_bytes

# The probe takes a second on a node; the limit is for one that hangs (an interpreter on a
# stuck network file system). The controller starts the nodes' agents some tens a second,
# and on a loaded machine fewer: so 60 s, or PROBE_S_PER_NODE per node when that is more.
PROBE_TIME_LIMIT_S = 60.0
PROBE_S_PER_NODE = 0.5
MIN_FREE_DISK = RunOptions().min_free_disk  # --min-free-disk's default, in bytes
SET_PYTHON = "pass --python PATH or set python for this node in the hostfile"


class PathFold(Protocol):
    """What the probe needs of the path check it carries (paths/in_probe.py's Fold)."""

    n: int
    port: int
    auto: bool
    outputs: dict[int, dict[str, str]]

    def args(self, index: int, master_addr: str) -> list[str]: ...

    def source(self) -> str: ...

    def bytecode(self) -> str: ...


@dataclass(frozen=True)
class ProbeResult:
    facts: dict[int, NodeFacts]  # by node rank: two entries may share a host name
    warnings: tuple[str, ...]
    failed: dict[int, NodeError] = field(default_factory=dict)  # raise_errors=False only


def probe_script(
    host: str,
    python: str,
    master_addr: str,
    *,
    check_port: bool,
    port: int | None,
    ifname: str | None,
    bind_cores: bool = False,
    container: ContainerSpec | None = None,
    trainer: bool = False,
    reach: list[str] | None = None,
    reach_source: str = "",
    reach_bytecode: str = "",
    auto_port: int | None = None,
) -> str:
    """The probe of one node. With `reach` (reach.py's arguments but --source and --alt)
    and its `reach_source` (and `reach_bytecode`, for a node whose interpreter can load it),
    the path check in the same interpreter (paths/in_probe.py); with `auto_port`, the port
    that --master-port auto takes when it is free on the master."""
    if not check_port:
        port_arg = "-"
    elif port is not None:
        port_arg = str(port)
    else:
        port_arg = f"auto={auto_port}" if auto_port is not None else "auto"
    return render_template(
        "probe.sh.j2",
        host=host,
        python=python,
        master_addr=master_addr,
        check_port=check_port,
        port_arg=port_arg,
        reach=reach,
        reach_source=reach_source if reach else "",
        reach_bytecode=reach_bytecode if reach else "",
        ifname=ifname,
        bind_cores=bind_cores,
        container=container,
        trainer=trainer,
    )


def parse_probe_output(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            values[key] = value.strip()
    return values


def parse_addresses(text: str) -> tuple[tuple[str, str], ...]:
    """`eth0=10.0.0.2,ib0=10.1.0.2` (the probe's addrs) -> (("eth0", "10.0.0.2"), ...)."""
    pairs = (item.partition("=") for item in text.split(",") if item)
    return tuple((name, addr) for name, _, addr in pairs if name and addr)


def master_address(cluster: Cluster, spec: JobSpec, connections: Sequence[NodeConnection]) -> str:
    """MASTER_ADDR as the probe must see it: --master-addr, else where node 0 was reached."""
    return spec.master_addr or connections[0].address


def probe_nodes(
    cluster: Cluster,
    spec: JobSpec,
    connections: Sequence[NodeConnection],
    tag: str = "probe",
    min_free_disk: int = MIN_FREE_DISK,
    only: Collection[int] | None = None,
    raise_errors: bool = True,
    progress: Progress | None = None,
    fold: PathFold | None = None,
) -> ProbeResult:
    """Probe every node (or the node ranks in `only`) in parallel; raise `NodeErrors`
    naming each node that cannot run (with raise_errors=False: return them, by node rank).
    With `fold`, when every node is probed, the path check runs in the probe's interpreter
    and each node's lines are kept in `fold.outputs` (paths/in_probe.py).

    Warnings: torch versions that differ, and nodes with less than `min_free_disk` free
    where they keep the run's files (a rank whose output cannot be written fails)."""
    master_addr = master_address(cluster, spec, connections)
    chosen = sorted(only) if only is not None else list(range(len(cluster.hosts)))
    hosts = [cluster.hosts[i] for i in chosen]
    connections = [connections[i] for i in chosen]
    pythons = [host.python or spec.python for host in hosts]
    if fold is not None and chosen != list(range(fold.n)):
        fold = None  # a re-probe of some nodes (spares): the check runs on its own
    scripts = [
        probe_script(
            host.name,
            python,
            master_addr,
            check_port=index == 0,
            port=spec.master_port,
            ifname=host.ifname or spec.ifname,
            bind_cores=spec.bind_cores,
            container=spec.container,
            trainer=spec.program.is_bundled_trainer,
            reach=fold.args(index, master_addr) if fold is not None else None,
            reach_source=fold.source() if fold is not None else "",
            reach_bytecode=fold.bytecode() if fold is not None else "",
            auto_port=fold.port if fold is not None and fold.auto else None,
        )
        for index, host, python in zip(chosen, hosts, pythons, strict=True)
    ]
    limit = probe_time_limit(len(chosen))
    if progress is not None:
        progress.begin("probing", len(chosen))
    try:
        results = run_on_nodes(
            connections,
            pythons,
            [["bash", "-c", s] for s in scripts],
            time_limit=limit,
            tag=tag,
            what="the preflight probe",
            progress=progress,
        )
    finally:
        if progress is not None:
            progress.end()
    errors: dict[int, NodeError] = {}
    stopped: dict[int, NodeError] = {}
    facts: dict[int, NodeFacts] = {}
    torch_versions: list[tuple[str, str]] = []
    warnings = []
    for index, host, python, connection, result in zip(
        chosen, hosts, pythons, connections, results, strict=True
    ):
        if result.state == NodePhase.LOST and MISSING_PYTHON_WORDS in result.detail:
            errors[index] = NodeError(
                host.name,
                f"cannot run python {python!r}: {MISSING_PYTHON_WORDS}; {SET_PYTHON}",
                exit_code=2,
            )
            continue
        if result.state == NodePhase.STOPPED and "time limit" in result.detail:
            errors[index] = NodeError(
                host.name,
                f"preflight probe did not finish within {limit:g} s "
                "(the node, or this machine, too busy; or the probe hangs there: try "
                "`orchestrator check`, or skip the probe with --no-preflight)",
            )
            continue
        if result.state == NodePhase.STOPPED:  # because another node failed, which is named
            stopped[index] = NodeError(host.name, "preflight probe stopped")
            continue
        if not result.ok:
            errors[index] = NodeError(
                host.name,
                f"preflight probe failed ({result.describe()})" + _last_line(result.output),
            )
            continue
        values = parse_probe_output(result.output)
        if fold is not None:
            fold.outputs[index] = values
        problem = _problem(host.name, python, values, index == 0, spec, host.ifname or spec.ifname)
        if problem is not None:
            errors[index] = problem
            continue
        if spec.container is not None:  # the image's python and torch are the job's
            values["python_version"] = values.get("container_python_version", "?")
            values["torch_version"] = values.get("container_torch_version", "?")
        torch_versions.append((host.name, values["torch_version"]))
        if values.get("disk_free_kb", "").isdigit():
            free = int(values["disk_free_kb"]) * 1024
            if free < min_free_disk:
                warnings.append(
                    f"{host.name}: only {human_bytes(free)} free in {values.get('disk_path')}, "
                    "where the node keeps this run's output; a rank whose output does not "
                    f"fit fails (--min-free-disk {format_size(min_free_disk)})"
                )
        facts[index] = NodeFacts(
            address=connection.address if not host.is_local else None,
            ifname=values.get("ifname") or None,
            route_source=values.get("route_source") or None,
            python_version=values.get("python_version"),
            torch_version=values.get("torch_version"),
            free_port=int(values["free_port"]) if values.get("free_port") else None,
            port_checked=values.get("port_free") == "yes",
            topology=(
                Topology.decode(values["cores_topology"]) if values.get("cores_topology") else None
            ),
            container_runtime=values.get("container_runtime"),
            addresses=parse_addresses(values.get("addrs", "")),
        )
    failed = errors or stopped
    if failed and raise_errors:
        raise NodeErrors(list(failed.values()), "preflight")
    if len({version for _, version in torch_versions}) > 1:
        by_version: dict[str, list[str]] = {}
        for host, version in torch_versions:
            by_version.setdefault(version, []).append(host)
        listing = ", ".join(f"{compress_hosts(h)}={v}" for v, h in by_version.items())
        warnings.append(
            f"torch versions differ between nodes ({listing}); ranks may fail to talk to each other"
        )
    return ProbeResult(facts, tuple(warnings), failed)


def probe_time_limit(nodes: int) -> float:
    """How long the preflight of `nodes` nodes may take in all."""
    return max(PROBE_TIME_LIMIT_S, PROBE_S_PER_NODE * nodes)


def _problem(
    host: str,
    python: str,
    values: dict[str, str],
    is_master: bool,
    spec: JobSpec,
    ifname: str | None,
) -> NodeError | None:
    if "python_error" in values:
        return NodeError(
            host,
            f"cannot run python {python!r}: {values['python_error']}; {SET_PYTHON}",
            exit_code=2,
        )
    if spec.container is not None:
        problem = container_problem(host, spec.container, values)
        if problem is not None:
            return problem
    elif values.get("torch_version", "none") == "none":
        return NodeError(
            host,
            f"torch is not installed for {python} "
            f"(python {values.get('python_version', '?')}); install it there, "
            "or point --python at an interpreter that has it",
            exit_code=2,
        )
    if ifname and values.get("ifname_exists") == "no":
        return NodeError(
            host,
            f"network interface {ifname!r} does not exist on this node; "
            "check --ifname / the hostfile's ifname (`ip -br link` lists them)",
            exit_code=2,
        )
    if is_master and spec.master_port is not None and values.get("port_free") == "no":
        return NodeError(
            host,
            f"MASTER_PORT {spec.master_port} is already in use on the "
            "master node; pick another --master-port or use --master-port auto",
            exit_code=2,
        )
    return None


def container_problem(
    host: str, container: ContainerSpec, values: dict[str, str]
) -> NodeError | None:
    """What keeps --container's image from running the job on `host` (exit 2), or None."""
    runtime = values.get("container_runtime", container.runtime)
    if values.get("container_image") == "missing":
        return NodeError(
            host,
            f"image {container.image} is not on this node ({runtime}: "
            f"{values.get('container_error', 'not found')}); pull it there first "
            f"(`{runtime} pull {container.image}`), or load it",
            exit_code=2,
        )
    if "container_error" in values:
        return NodeError(
            host,
            f"cannot run {container.image} with {runtime}: {values['container_error']}",
            exit_code=2,
        )
    torch = values.get("container_torch_version", "none")
    python = container.python
    if torch == "none":
        return NodeError(
            host,
            f"torch is not installed for {python} in image {container.image} "
            f"(python {values.get('container_python_version', '?')}); use an image with "
            "torch, or point --container-python at the interpreter that has it",
            exit_code=2,
        )
    if values.get("container_orchestrator") == "no":
        return NodeError(
            host,
            f"the bundled trainer runs `{python} -m orchestrator.trainer` inside the image, "
            f"and {container.image} has no orchestrator package; install it in the image "
            "(pip install orchestrator), or give your own script after --",
            exit_code=2,
        )
    return None


def _last_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return f": {lines[-1]}" if lines else ""
