"""Before anything starts: the launch's options, the preflight probe (spares included),
the plan and its scripts, the code copied to the nodes, and the --dry-run text."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from orchestrator.backends.base import NodeConnection, SshOptions
from orchestrator.console.progress import Progress
from orchestrator.errors import ConfigError, NodeError, NodeErrors
from orchestrator.hostlist import compress_hosts
from orchestrator.hosts.hostfile import Cluster
from orchestrator.launch.recovery import NodePool, Probe
from orchestrator.nodes.probe import MIN_FREE_DISK, ProbeResult, probe_nodes
from orchestrator.plan.launch_plan import LaunchPlan, NodeFacts, make_plan
from orchestrator.plan.scripts import command_line, plan_yaml, render_node_scripts, script_name
from orchestrator.plan.spec import JobSpec
from orchestrator.supervise.stragglers import RATIO, WINDOW_S


@dataclass(frozen=True)
class LaunchOptions:
    run_dir: str
    run_id: str
    argv: tuple[str, ...]  # the orchestrator command line, for script headers
    grace: float = 10.0
    heartbeat_timeout: float = 30.0
    stall_timeout: float = 600.0
    min_free_disk: int = MIN_FREE_DISK
    keep_node_logs: bool = False
    bad_nodes: str | None = None  # --bad-nodes FILE: where node faults write the hosts out
    color: str = "auto"
    fold: bool = True  # --no-fold: the console shows every line as printed
    footer: bool = True  # --no-footer: no summary line under the stream on a terminal
    stragglers: tuple[float, float] = (RATIO, WINDOW_S)  # --stragglers RATIO,SECONDS
    preflight: bool = True
    ssh: SshOptions | None = None


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
    if connections is not None and options.preflight:
        pool = pool or NodePool(cluster, connections, options.run_id)
        warnings = pool.preflight(preflight_probe(spec, options, progress))
        cluster, facts = pool.cluster, pool.facts
        for line in versions_summary(cluster, facts):
            note(line)
        for warning in warnings:
            note(f"warning: {warning}")
    plan = make_plan(cluster, spec, options.run_id, facts, pool.attempt if pool else 1)
    scripts = render_node_scripts(plan, command_line(options.argv, plan.secret_names))
    return plan, scripts


def versions_summary(cluster: Cluster, facts: dict[int, NodeFacts]) -> list[str]:
    """What the preflight found, folded: '64 nodes: python 3.11.7, torch 2.13.0+cpu' when
    all agree, else one line per kind, the most common first, each with its host list."""
    kinds: dict[str, list[str]] = {}
    for index, fact in sorted(facts.items()):
        text = f"python {fact.python_version}, torch {fact.torch_version}"
        kinds.setdefault(text, []).append(cluster.hosts[index].name)
    if len(kinds) == 1:
        ((text, hosts),) = kinds.items()
        return [f"{len(hosts)} node(s): {text}" if len(hosts) > 1 else f"{hosts[0]}: {text}"]
    ordered = sorted(kinds.items(), key=lambda item: -len(item[1]))
    return [f"{compress_hosts(hosts)}: {text}" for text, hosts in ordered]


def preflight_probe(
    spec: JobSpec, options: LaunchOptions, progress: Progress | None = None
) -> Probe:
    """The preflight probe of some node ranks of a cluster, failures returned, not raised."""

    def probe(cluster: Cluster, connections: Sequence[NodeConnection], only) -> ProbeResult:
        return probe_nodes(
            cluster,
            spec,
            connections,
            tag=options.run_id,
            min_free_disk=options.min_free_disk,
            only=only,
            raise_errors=False,
            progress=progress,
        )

    return probe


def sync_code(
    plan: LaunchPlan,
    connections: Sequence[NodeConnection],
    note,
    progress: Progress | None = None,
) -> None:
    """--sync: copy the directory into every node's run directory, in parallel; how far it
    got on the progress line, then one line per file count (`ceon[1-64]: synced 12 file(s)
    to each node's run folder (...)`), not one per node."""
    if plan.sync_dir is None:
        return

    def one(node, connection) -> int:
        try:
            return connection.put_tree(plan.sync_dir, node.workdir)
        except OSError as exc:
            raise NodeError(
                node.name, f"copying {plan.sync_dir} to {node.workdir} failed: {exc}"
            ) from None

    if progress is not None:
        progress.begin("syncing", plan.nnodes)
    try:
        with ThreadPoolExecutor(max_workers=min(32, plan.nnodes)) as pool:
            futures = [pool.submit(one, n, c) for n, c in zip(plan.nodes, connections, strict=True)]
            if progress is not None:
                for future in futures:
                    future.add_done_callback(lambda f: progress.tick(f.exception() is None))
    finally:
        if progress is not None:
            progress.end()
    errors, synced = [], {}
    for node, future in zip(plan.nodes, futures, strict=True):
        try:
            synced.setdefault(future.result(), []).append(node)
        except NodeError as exc:
            errors.append(exc)
    for count, nodes in synced.items():
        where = {node.workdir for node in nodes}
        into = (
            next(iter(where))
            if len(where) == 1
            else f"each node's run folder ({nodes[0].workdir} on {nodes[0].name}, ...)"
        )
        note(f"{compress_hosts(n.name for n in nodes)}: synced {count} file(s) to {into}")
    if errors:
        raise NodeErrors(errors, "--sync")


def dry_run_text(plan: LaunchPlan, scripts: dict[str, str]) -> str:
    parts = ["# plan.yaml", plan_yaml(plan)]
    for node in plan.nodes:
        parts += [
            f"# ---- {script_name(node)} (runs on {node.name}) ----",
            scripts[script_name(node)],
        ]
    return "\n".join(parts)


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
