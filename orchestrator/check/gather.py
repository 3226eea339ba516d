"""`orchestrator check`, steps 0-2: reach every node, learn its facts, and test whether it
can open a TCP connection to MASTER_ADDR:MASTER_PORT. Every step runs on all nodes at once
through the node agents (`run_on_nodes`, tagged with the check's run id); a node that fails
a step is reported, never the end of the check.

The rendezvous test needs two phases: with --master-port auto the nodes learn the port only
from the master's probe. In the second phase the master opens a short-lived listener on
that port and every node (the master too) connects to it from the address of the interface
chosen for NCCL/gloo, retrying while the listener comes up (see orchestrator.check.reach).
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from orchestrator.backends.base import NodeConnection
from orchestrator.check.facts import Master, NodeReport
from orchestrator.errors import NodeError
from orchestrator.hosts.hostfile import Cluster
from orchestrator.nodes.execute import NodeResult, run_on_nodes
from orchestrator.nodes.paths.found import PathNode, PathReport, read_report
from orchestrator.nodes.paths.prove import path_argvs, store_wait
from orchestrator.nodes.probe import parse_addresses, parse_probe_output, probe_time_limit
from orchestrator.plan.container import ContainerSpec
from orchestrator.plan.scripts import render_template
from orchestrator.plan.spec import DEFAULT_MASTER_PORT
from orchestrator.record.states import NodePhase

RTT_SAMPLES = 5
REACH_TIMEOUT_S = 5.0


# --- step 0: connections ----------------------------------------------------------------


def ssh_rtts(connections: Sequence[NodeConnection]) -> dict[int, float]:
    """Median of RTT_SAMPLES SSH keepalive round trips per SSH connection, in ms (by id)."""

    def one(connection) -> float | None:
        client = getattr(connection, "client", None)
        if client is None:
            return None
        transport = client.get_transport()
        samples = []
        for _ in range(RTT_SAMPLES):
            begin = time.perf_counter()
            transport.global_request("keepalive@openssh.com", wait=True)
            if not transport.is_active():
                return None
            samples.append((time.perf_counter() - begin) * 1e3)
        return statistics.median(samples)

    if not connections:
        return {}
    pool = ThreadPoolExecutor(max_workers=min(64, len(connections)))
    try:
        futures = {id(c): pool.submit(one, c) for c in connections}
        found = {}
        for key, future in futures.items():
            try:
                value = future.result(timeout=10.0)
            except Exception:  # a node too slow to answer keepalives shows no RTT
                value = None
            if value is not None:
                found[key] = value
        return found
    finally:
        pool.shutdown(wait=False)


# --- step 1: node facts -----------------------------------------------------------------


def probe_facts(
    cluster: Cluster,
    connections: list,
    pythons: list[str],
    master_addr: str,
    *,
    ifname: str | None,
    master_port: int | None,
    tag: str,
    container: ContainerSpec | None = None,
) -> dict[int, tuple[dict, str | None]]:
    """{node index: (key=values, error)} for every connected node (check_probe.sh.j2); with
    `container`, python, torch, NCCL and the GPUs are looked at inside its image."""
    argvs = {}
    for index, (host, connection) in enumerate(zip(cluster.hosts, connections, strict=True)):
        if isinstance(connection, NodeError):
            continue
        script = render_template(
            "check_probe.sh.j2",
            host=host.name,
            python=pythons[index],
            master_addr=master_addr,
            ifname=host.ifname or ifname,
            is_master=index == 0,
            port=master_port,
            default_port=DEFAULT_MASTER_PORT,
            container=container,
        )
        argvs[index] = ["bash", "-c", script]
    results = run_each(connections, pythons, argvs, probe_time_limit(len(argvs)), tag)
    return {
        index: ((parse_probe_output(r.output), None) if r.ok else ({}, _failure(r, pythons[index])))
        for index, r in results.items()
    }


def run_each(
    connections: list, pythons: list[str], argvs: dict[int, list[str]], time_limit: float, tag: str
) -> dict[int, NodeResult]:
    """run_on_nodes over the nodes in `argvs` (agents tagged with the run id); a node whose
    agent cannot even start gets a failed result instead of ending the check. Ctrl-C or
    SIGTERM stops every node and the check: run_on_nodes raises errors.Interrupted (exit
    128 + the signal's number)."""
    results: dict[int, NodeResult] = {}
    pending = dict(argvs)
    while pending:
        order = sorted(pending)
        try:
            done = run_on_nodes(
                [connections[i] for i in order],
                [pythons[i] for i in order],
                [pending[i] for i in order],
                time_limit=time_limit,
                tag=tag,
            )
        except NodeError as exc:
            failed = next((i for i in order if connections[i].host == exc.host), None)
            if failed is None:
                raise
            results[failed] = NodeResult(exc.host, None, "", NodePhase.LOST, exc.message)
            del pending[failed]
            continue
        results.update(zip(order, done, strict=True))
        break
    return results


def _failure(result: NodeResult, python: str) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    tail = f": {lines[-1]}" if lines else ""
    if result.exit_code == 127 and "not found" in tail:
        return f"python {python!r} not found; pass --python PATH or set python= in the hostfile"
    return f"{result.describe()}{tail}"


# --- step 2: rendezvous reachability ----------------------------------------------------


def reach_master(
    reports: list[NodeReport], connections: list, master: Master, *, timeout: float, tag: str
) -> tuple[list[NodeReport], PathReport | None]:
    """The path check (orchestrator.nodes.paths): every usable node connects to
    MASTER_ADDR:PORT while the master listens, and to its peers; each node's store result
    goes in its report, the peers' in the PathReport."""
    # A node whose interface is missing, or has no address to bind, is diagnosed as such.
    connecting = [
        r
        for r in reports
        if r.usable and r.get("ifname_exists") != "no" and (r.source or not r.get("ifname"))
    ]
    if not reports[0].usable or not connecting:
        why = "the master cannot run the listener" if not reports[0].usable else "no node can"
        return [replace(r, reach_skipped=why) for r in reports], None
    nodes = [
        PathNode(
            r.index,
            r.host,
            r.python,
            r.source,
            r.get("ifname"),
            tuple((n, a) for n, a in parse_addresses(r.get("addrs")) if n != r.get("ifname")),
        )
        for r in connecting
    ]
    argvs = path_argvs(
        nodes,
        master.addr,
        master.port or 0,
        token=secrets.token_hex(8),
        timeout=timeout,
        sshd_port=master.sshd_port,
    )
    pythons = [r.python for r in reports]
    limit = store_wait(len(nodes), timeout) + 3 * timeout + 30.0
    results = run_each(connections, pythons, argvs, limit, tag)
    updated, outputs = [], {}
    for report in reports:
        result = results.get(report.index)
        if result is None:
            updated.append(replace(report, reach_skipped="not testable (see the problems)"))
        elif not result.ok:
            updated.append(
                replace(
                    report, reach={"reach": "error", "reach_error": _failure(result, report.python)}
                )
            )
        else:
            outputs[report.index] = parse_probe_output(result.output)
            updated.append(replace(report, reach=outputs[report.index]))
    return updated, read_report(nodes, outputs, master.addr, master.port or 0)
