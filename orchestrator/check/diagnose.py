"""`orchestrator check`: what is wrong with the nodes, as problems that say what to fix, each
flagging the node table column it concerns. Pure: no network, no files.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.check.facts import Master, NodeReport
from orchestrator.check.measure import on_gpus
from orchestrator.check.results import Problem
from orchestrator.nodes.paths.found import PathReport, failure_lines
from orchestrator.nodes.probe import MIN_FREE_DISK
from orchestrator.sizes import human_bytes


def node_problems(nodes: Sequence[NodeReport], master: Master, backend: str) -> list[Problem]:
    """Everything wrong with the nodes, each with what to do about it."""
    problems: list[Problem] = []
    for node in nodes:
        problems += _one_node(node, master, backend)
    problems += _mismatches(nodes, backend)
    problems += _reach_problems(nodes, master)
    return problems


def _one_node(node: NodeReport, master: Master, backend: str) -> list[Problem]:
    host = node.host
    if not node.connected:
        return [Problem(host, f"unreachable over SSH: {node.ssh_error}", column="SSH")]
    if node.probe_error is not None:
        return [Problem(host, f"the probe failed: {node.probe_error}", column="SSH")]
    if "python_error" in node.probe or "python_version" not in node.probe:
        return [
            Problem(
                host,
                f"cannot run python {node.python!r}: "
                f"{node.get('python_error') or 'no answer'}; pass --python PATH or set "
                "python= for this node in the hostfile",
                column="PYTHON",
            )
        ]
    found: list[Problem] = []
    if "torch_version" not in node.probe:
        found.append(
            Problem(
                host,
                f"torch is not installed for {node.python} (python "
                f"{node.get('python_version')}: {node.get('torch_error') or '?'}); "
                "install it there, or point --python (or the hostfile's python=) "
                "at an interpreter that has it",
                column="TORCH",
            )
        )
    elif node.get(backend) != "yes":
        found.append(
            Problem(
                host,
                f"torch {node.get('torch_version')} here has no "
                f"{backend} backend; install a torch build with it"
                + (" or use --backend gloo" if on_gpus(backend) else ""),
                column="TORCH",
            )
        )
    elif on_gpus(backend) and node.gpu_shortfall:
        found.append(
            Problem(
                host,
                f"{node.gpu_shortfall}: NCCL needs one GPU per rank; {node.gpu_fix}",
                column="CUDA/SLOTS",
            )
        )
    ifname = node.get("ifname")
    if node.get("ifname_exists") == "no":
        found.append(
            Problem(
                host,
                f"network interface {ifname!r} does not exist here; check "
                "--ifname / the hostfile's ifname= (`ip -br link` lists them)",
                column="IFNAME",
            )
        )
    elif ifname and not node.source:
        found.append(
            Problem(
                host,
                f"interface {ifname} has no IPv4 address for NCCL/gloo to "
                "bind; choose another with --ifname",
                column="IFNAME",
            )
        )
    if node.index == 0 and node.get("port_free") == "no":
        found.append(
            Problem(
                host,
                f"MASTER_PORT {node.get('port')} is already in use on the "
                "master; pick another --master-port, or --master-port auto",
                column="MASTER",
            )
        )
    free = node.disk_free
    if free is not None and free < MIN_FREE_DISK:
        found.append(
            Problem(
                host,
                f"only {human_bytes(free)} free in {node.get('disk_path')}, "
                f"where runs keep their files; free at least "
                f"{human_bytes(MIN_FREE_DISK)}",
                blocks_job=False,
                column="DISK FREE",
            )
        )
    return found


def _mismatches(nodes: Sequence[NodeReport], backend: str) -> list[Problem]:
    usable = [n for n in nodes if n.usable and "torch_version" in n.probe]
    found = []

    def differs(key: str, what: str, fix: str, column: str, shorten=lambda v: v) -> None:
        values = {n.host: shorten(n.get(key)) for n in usable if n.get(key)}
        if len(set(values.values())) > 1:
            listing = ", ".join(f"{h} {v}" for h, v in values.items())
            found.append(
                Problem(
                    "cluster",
                    f"{what} differ between nodes ({listing}); {fix}",
                    blocks_job=False,
                    column=column,
                )
            )

    differs("torch_version", "torch versions", "install the same torch on every node", "TORCH")
    differs(
        "python_version",
        "python versions",
        "use the same python on every node",
        "PYTHON",
        lambda v: ".".join(v.split(".")[:2]),
    )
    if on_gpus(backend):
        differs("nccl_version", "NCCL versions", "install the same torch/NCCL everywhere", "NCCL")
    with_gpus = [n.host for n in usable if n.cuda_devices]
    if with_gpus and len(with_gpus) < len(usable):
        without = ", ".join(n.host for n in usable if not n.cuda_devices)
        found.append(
            Problem(
                "cluster",
                f"{without} see no CUDA device while "
                f"{', '.join(with_gpus)} do; the check falls back to gloo. Fix the "
                "drivers or the CUDA torch build there",
                blocks_job=False,
                column="CUDA/SLOTS",
            )
        )
    return found


def _reach_problems(nodes: Sequence[NodeReport], master: Master) -> list[Problem]:
    """Nodes that cannot open a TCP connection to MASTER_ADDR:MASTER_PORT, diagnosed."""
    failed = [n for n in nodes if n.reach.get("reach") == "error"]
    master_node = nodes[0] if nodes else None
    found = []
    if master_node is not None and master_node.reach.get("listen_error"):
        found.append(
            Problem(
                master.host,
                f"cannot listen on MASTER_PORT {master.port}: "
                f"{master_node.reach['listen_error']}; pick another --master-port",
                column="MASTER",
            )
        )
        return found
    # Every other node reaches the master's sshd but not the port: the port is blocked there.
    port_only = [n for n in failed if n.index != 0 and n.reach.get("sshd_port") == "ok"]
    tested = [n for n in nodes if n.reach.get("reach") and n.index != 0]
    if len(port_only) >= 2 and len(port_only) == len(tested):
        names = ", ".join(n.host for n in port_only)
        error = port_only[0].reach.get("reach_error", "")
        found.append(
            Problem(
                master.host,
                f"TCP port {master.port} on {master.addr} is not "
                f"reachable from {names} ({error}) although its sshd port "
                f"{master.sshd_port} is: a firewall blocks port {master.port}. "
                f"Open TCP port {master.port} on {master.host}, or pick an open "
                "one with --master-port",
                column="MASTER",
            )
        )
        failed = [n for n in failed if n not in port_only]
    for node in failed:
        ifname = node.get("ifname")
        via = (
            f"from {ifname} ({node.source})"
            if ifname and node.source
            else "(no interface routes there)"
            if not ifname
            else f"from {ifname}"
        )
        error = node.reach.get("reach_error", "?")
        alt_ifname, _, alt_addr = node.reach.get("reach_alt", "").partition(" ")
        if alt_addr:
            fix = (
                f"{alt_ifname} ({alt_addr}) does reach it: set --ifname {alt_ifname} "
                "(or ifname= in the hostfile)"
            )
        elif node.reach.get("sshd_port") == "ok":
            fix = (
                f"the master's sshd port {master.sshd_port} answers, so port "
                f"{master.port} is blocked on the way: open TCP port {master.port} on "
                f"{master.host} to this node, or pick another --master-port"
            )
        else:
            fix = (
                "set --ifname (or ifname= in the hostfile) to an interface that routes to "
                f"{master.addr}, or fix the route/firewall between them"
            )
        found.append(
            Problem(
                node.host, f"cannot reach {master.endpoint} {via}: {error}; {fix}", column="MASTER"
            )
        )
    return found


def path_problems(paths: PathReport | None) -> list[Problem]:
    """Peers that cannot reach each other (the store's failures are _reach_problems')."""
    if paths is None:
        return []
    peers_only = PathReport(
        paths.nodes, paths.outcomes, tuple(f for f in paths.failures if not f.is_store)
    )
    return [Problem(host, line, column="PEERS") for host, line in failure_lines(peers_only)]
