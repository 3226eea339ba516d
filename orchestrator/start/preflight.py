"""Before anything starts: the preflight probe (spares included), the plan and its scripts,
and a missing script caught while every node is this machine."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from orchestrator.backends.base import NodeConnection
from orchestrator.console.progress import Progress
from orchestrator.errors import ConfigError
from orchestrator.hostlist import compress_hosts
from orchestrator.hosts.hostfile import Cluster
from orchestrator.nodes.execute import run_on_nodes
from orchestrator.nodes.paths.found import PathNode
from orchestrator.nodes.paths.in_probe import Fold
from orchestrator.nodes.paths.pairs import scheme
from orchestrator.nodes.paths.prove import prove_paths, raise_failures
from orchestrator.nodes.probe import ProbeResult, probe_nodes
from orchestrator.plan.launch_plan import LaunchPlan, NodeFacts, make_plan
from orchestrator.plan.scripts import command_line, render_node_scripts
from orchestrator.plan.spec import JobSpec
from orchestrator.start.pool import NodePool, Probe
from orchestrator.start.settings import LaunchOptions


def prepare(
    cluster: Cluster,
    spec: JobSpec,
    options: LaunchOptions,
    connections: Sequence[NodeConnection] | None,
    note=lambda text: None,
    pool: NodePool | None = None,
    progress: Progress | None = None,
) -> tuple[LaunchPlan, dict[str, str]]:
    """Probe (when connected), plan and render; nothing starts. With a `pool` (--spares),
    the preflight probes the spares too, and a spare replaces a host that fails it."""
    facts: dict[int, NodeFacts] = {}
    fold = None
    if connections is not None and options.run.preflight:
        pool = pool or NodePool(cluster, connections, options.run_id)
        if options.run.path_check and len(cluster.hosts) > 1 and not cluster.is_local:
            fold = fold_paths(pool, spec)
        warnings = pool.preflight(preflight_probe(spec, options, progress, fold))
        cluster, facts = pool.cluster, pool.facts
        for line in versions_summary(cluster, facts):
            note(line)
        for warning in warnings:
            note(f"warning: {warning}")
    plan = make_plan(cluster, spec, options.run_id, facts, pool.attempt if pool else 1)
    if facts and options.run.path_check and len(plan.nodes) > 1 and not cluster.is_local:
        prove_plan_paths(
            plan, facts, pool.connections if pool else connections, options, note, fold
        )
    scripts = render_node_scripts(plan, command_line(options.argv, plan.secret_names))
    return plan, scripts


def prove_plan_paths(
    plan: LaunchPlan,
    facts: dict[int, NodeFacts],
    connections: Sequence[NodeConnection],
    options: LaunchOptions,
    note=lambda text: None,
    fold: Fold | None = None,
) -> None:
    """Every node connects to the master's store port and to its peers from the address the
    job binds (orchestrator.nodes.paths); a path that does not connect ends the launch (exit
    2) before anything starts. What the probe found with `fold`, when it proved the plan's
    nodes and port; else the check's own round through the node agents."""
    nodes = [
        PathNode(
            node.node_rank,
            node.host.name,
            node.python,
            facts[node.node_rank].address_of(node.ifname) or "",
            node.ifname or "",
            facts[node.node_rank].addresses,
        )
        for node in plan.nodes
    ]

    def run(argvs: dict[int, list[str]], limit: float) -> dict[int, tuple[str | None, str]]:
        order = sorted(argvs)
        results = run_on_nodes(
            [connections[i] for i in order],
            [plan.nodes[i].python for i in order],
            [argvs[i] for i in order],
            time_limit=limit,
            tag=options.run_id,
            what="the path check",
        )
        return {
            i: (r.output, None if r.ok else r.describe())
            for i, r in zip(order, results, strict=True)
        }

    if fold is not None and fold.usable(nodes, plan.master_port):
        report = fold.report(nodes, plan.master_addr)
        raise_failures(report)
        note(f"paths: {report.tested()} TCP connection(s) made by the probe: {scheme(len(nodes))}")
        return
    began = time.monotonic()
    report = prove_paths(
        nodes, plan.master_addr, plan.master_port, run, sshd_port=sshd_port(connections)
    )
    raise_failures(report)
    note(
        f"paths: {report.tested()} TCP connection(s) made in {time.monotonic() - began:.1f} s: "
        f"{scheme(len(nodes))}"
    )


def fold_paths(pool: NodePool, spec: JobSpec) -> Fold | None:
    """The path check in the probe's run (paths/in_probe.py), when the probe covers the nodes
    once in node-rank order: not with spares, which may replace a node."""
    if pool.spares:
        return None
    return Fold.for_launch(len(pool.active), spec.master_port, sshd_port(pool.connections))


def sshd_port(connections: Sequence[NodeConnection]) -> int:
    """The master's sshd port, tried from the job's address when its store port is not."""
    return getattr(getattr(connections[0], "target", None), "port", None) or 22


def versions_summary(cluster: Cluster, facts: dict[int, NodeFacts]) -> list[str]:
    """What the preflight found, folded: '64 nodes: python 3.11.7, torch 2.13.0+cpu' when
    all agree, else one line per kind, the most common first, each with its host list."""
    kinds: dict[str, list[str]] = {}
    for index, fact in sorted(facts.items()):
        text = f"python {fact.python_version}, torch {fact.torch_version}"
        if fact.container_runtime:  # --container: the image's, as run by this runtime
            text = f"{fact.container_runtime}, in the image: {text}"
        kinds.setdefault(text, []).append(cluster.hosts[index].name)
    if len(kinds) == 1:
        ((text, hosts),) = kinds.items()
        return [f"{len(hosts)} node(s): {text}" if len(hosts) > 1 else f"{hosts[0]}: {text}"]
    ordered = sorted(kinds.items(), key=lambda item: -len(item[1]))
    return [f"{compress_hosts(hosts)}: {text}" for text, hosts in ordered]


def preflight_probe(
    spec: JobSpec, options: LaunchOptions, progress: Progress | None = None, fold=None
) -> Probe:
    """The preflight probe of some node ranks of a cluster, failures returned, not raised."""

    def probe(cluster: Cluster, connections: Sequence[NodeConnection], only) -> ProbeResult:
        return probe_nodes(
            cluster,
            spec,
            connections,
            tag=options.run_id,
            min_free_disk=options.run.min_free_disk,
            only=only,
            raise_errors=False,
            progress=progress,
            fold=fold,
        )

    return probe


def check_script_exists(cluster: Cluster, spec: JobSpec) -> None:
    """When every node is this machine, a missing script is caught before anything starts."""
    program = spec.program
    if spec.sync_dir is not None and not os.path.isdir(spec.sync_dir):
        raise ConfigError(f"--sync {spec.sync_dir!r}: not a directory")
    if program.is_module or not cluster.is_local:
        return
    base = spec.sync_dir if spec.sync_dir else spec.workdir
    path = program.target if os.path.isabs(program.target) else os.path.join(base, program.target)
    if not os.path.isfile(path):
        where = "--sync" if spec.sync_dir else "--workdir"
        raise ConfigError(
            f"script {program.target!r} not found (looked in {base}); "
            f"give its path relative to {where} or an absolute path"
        )
