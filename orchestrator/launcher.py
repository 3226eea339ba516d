"""Launch a job: connect -> probe -> plan -> render -> run record -> start agents -> supervise.

The one place where the steps of the data flow meet; each step is a call into its module.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

from orchestrator.backends import close_all, connect_cluster
from orchestrator.backends.base import NodeConnection, SshOptions
from orchestrator.copies import remove_copies
from orchestrator.detach import run_detached
from orchestrator.errors import ConfigError, NodeError, NodeErrors, OrchestratorError
from orchestrator.hostfile import Cluster
from orchestrator.logs import LogSink, use_color
from orchestrator.nodes import Event, NodeSession, start_sessions
from orchestrator.plan import NODE_RUNS_DIR, LaunchPlan, NodeFacts, make_plan
from orchestrator.probe import MIN_FREE_DISK, probe_nodes
from orchestrator.render import (
    command_line,
    plan_yaml,
    render_node_scripts,
    script_name,
    write_rendered,
)
from orchestrator.runs import RunRecord, now_iso, process_start_time
from orchestrator.spec import JobSpec, inherited_secrets
from orchestrator.supervise import NodeState, Outcome, RankState, Supervisor, signals_to


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
    color: str = "auto"
    preflight: bool = True
    ssh: SshOptions | None = None


def prepare(
    cluster: Cluster,
    spec: JobSpec,
    options: LaunchOptions,
    connections: Sequence[NodeConnection] | None,
    note=lambda text: None,
) -> tuple[LaunchPlan, dict[str, str]]:
    """Probe (when connected), plan and render; nothing starts."""
    facts: dict[int, NodeFacts] = {}
    if connections is not None and options.preflight:
        result = probe_nodes(
            cluster, spec, connections, tag=options.run_id, min_free_disk=options.min_free_disk
        )
        facts = result.facts
        for index, fact in facts.items():
            note(
                f"{cluster.hosts[index].name}: python {fact.python_version}, "
                f"torch {fact.torch_version}"
            )
        for warning in result.warnings:
            note(f"warning: {warning}")
    plan = make_plan(cluster, spec, options.run_id, facts)
    scripts = render_node_scripts(plan, command_line(options.argv, plan.secret_names))
    return plan, scripts


def sync_code(plan: LaunchPlan, connections: Sequence[NodeConnection], note) -> None:
    """--sync: copy the directory into every node's run directory, in parallel."""
    if plan.sync_dir is None:
        return

    def one(node, connection) -> int:
        try:
            return connection.put_tree(plan.sync_dir, node.workdir)
        except OSError as exc:
            raise NodeError(
                node.name, f"copying {plan.sync_dir} to {node.workdir} failed: {exc}"
            ) from None

    with ThreadPoolExecutor(max_workers=min(32, plan.nnodes)) as pool:
        futures = [pool.submit(one, n, c) for n, c in zip(plan.nodes, connections, strict=True)]
    errors = []
    for node, future in zip(plan.nodes, futures, strict=True):
        try:
            note(f"{node.name}: synced {future.result()} file(s) to {node.workdir}")
        except NodeError as exc:
            errors.append(exc)
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


def base_status(plan: LaunchPlan, options: LaunchOptions, backend: str) -> dict:
    pid = os.getpid()
    return {
        "run_id": plan.run_id,
        "backend": backend,
        "state": "starting",
        "command": command_line(options.argv, plan.secret_names),
        "program": plan.program.describe(),
        "nnodes": plan.nnodes,
        "world_size": plan.world_size,
        "master": f"{plan.master_addr}:{plan.master_port}",
        "started_at": now_iso(),
        "ended_at": None,
        "exit_code": None,
        "summary": None,
        "controller": {
            "pid": pid,
            "start_time": process_start_time(pid),
            "host": socket.gethostname(),
        },
    }


def run_plan(
    plan: LaunchPlan,
    scripts: dict[str, str],
    spec: JobSpec,
    options: LaunchOptions,
    connections: Sequence[NodeConnection],
    record: RunRecord,
    console: BinaryIO | None,
    on_started: Callable[[], None] = lambda: None,
) -> Outcome:
    """Start every node's agent with its script and supervise the run to its end.

    `on_started` is called once every node's script is running.
    """
    secrets = {k: v for k, v in spec.env if k in plan.secret_names}
    # A job on this machine inherits its environment, secrets included (HF_TOKEN=...).
    inherited = inherited_secrets() if plan.is_local else []
    secret_values = sorted({v for v in [*secrets.values(), *inherited] if v}, key=len, reverse=True)

    def mask(data: bytes) -> bytes:
        for value in secret_values:
            data = data.replace(value.encode(), b"***")
        return data

    rank_labels, node_labels, nodes, ranks = {}, {}, [], []
    for node in plan.nodes:
        node_labels[node.node_rank] = node.name
        nodes.append(NodeState(index=node.node_rank, host=node.name, ranks=tuple(node.ranks)))
        for local_rank, rank in enumerate(node.ranks):
            rank_labels[rank] = f"{node.name} r{rank}"
            ranks.append(RankState(rank, node.node_rank, local_rank, node.name))
    sink = LogSink(
        record.logs_dir,
        rank_labels,
        node_labels,
        console,
        use_color(sys.stdout, options.color),
        mask=mask,
    )
    backend = "local" if plan.is_local else "ssh"
    base = base_status(plan, options, backend)
    events: queue.Queue[Event] = queue.Queue(maxsize=4096)
    sessions: list[NodeSession] = []

    started_nodes = False

    def on_change(sup: Supervisor) -> None:
        nonlocal started_nodes
        state = "stopping" if sup.stopping else "running"
        record.write_status({**base, "state": state, **sup.status()})
        if not started_nodes and all(n.state != "starting" for n in sup.nodes):
            started_nodes = True
            on_started()

    sink.note(
        f"run {plan.run_id}: {plan.world_size} rank(s) on {plan.nnodes} node(s), "
        f"master {plan.master_addr}:{plan.master_port}; logs in {record.logs_dir}"
    )
    supervisor = Supervisor(
        nodes,
        ranks,
        sessions,
        events,
        sink,
        grace=options.grace,
        heartbeat_timeout=options.heartbeat_timeout,
        stall_timeout=options.stall_timeout,
        max_restarts=plan.max_restarts,
        on_change=on_change,
    )
    started = time.monotonic()
    record.write_status(base)
    try:
        with signals_to(supervisor):
            starts = [
                (
                    node.node_rank,
                    connection,
                    node.python,
                    plan.run_id,
                    {
                        "run_id": plan.run_id,
                        "node_dir": node.node_dir,
                        "script": scripts[script_name(node)],
                        "script_name": script_name(node),
                        "ranks": list(node.ranks),
                        "env": secrets,
                        "secrets": secret_values,
                        "grace": options.grace,
                        "heartbeat_timeout": options.heartbeat_timeout,
                        "stall_timeout": options.stall_timeout,
                    },
                )
                for node, connection in zip(plan.nodes, connections, strict=True)
            ]
            try:
                sessions.extend(start_sessions(starts, events))
            except OrchestratorError as exc:  # the started nodes were stopped
                record.write_status(
                    {
                        **base,
                        **supervisor.status(),
                        "state": "failed",
                        "exit_code": exc.exit_code,
                        "ended_at": now_iso(),
                        "summary": str(exc),
                    }
                )
                raise
            outcome = supervisor.run()
    finally:
        for session in sessions:
            session.close()
    elapsed = time.monotonic() - started
    for line in outcome.closing_lines(plan.run_id, elapsed, record.logs_dir):
        sink.note(line)
    sink.flush()
    copies = node_copies(plan, options, outcome, connections, sink.note)
    sink.close()
    record.write_status(
        {
            **base,
            **supervisor.status(),
            "state": outcome.state,
            "exit_code": outcome.exit_code,
            "ended_at": now_iso(),
            "summary": outcome.summary or None,
            "node_copies": copies,
        }
    )
    return outcome


def node_copies(
    plan: LaunchPlan,
    options: LaunchOptions,
    outcome: Outcome,
    connections: Sequence[NodeConnection],
    note: Callable[[str], None],
) -> str:
    """Remove the nodes' copies of a run that succeeded (this machine's record now holds
    all of it) unless --keep-node-logs; say where they are, or what became of them."""
    where = f"~/{NODE_RUNS_DIR}/{plan.run_id} on each node"
    if options.keep_node_logs:
        return f"kept (--keep-node-logs): {where}"
    if outcome.state != "succeeded":
        return f"kept (the run {outcome.state}; `orchestrator clean` removes them): {where}"
    failed = remove_copies(
        connections, [node.python for node in plan.nodes], [node.node_dir for node in plan.nodes]
    )
    for why in failed:
        note(f"warning: could not remove the node's copy of the run: {why}")
    return f"removed, except on: {'; '.join(failed)}" if failed else "removed"


def launch(
    cluster: Cluster,
    spec: JobSpec,
    options: LaunchOptions,
    *,
    dry_run: bool = False,
    detach: bool = False,
    out: BinaryIO | None = None,
) -> int:
    """The whole launch; returns the exit code. Raises OrchestratorError for bad input."""
    out = out or sys.stdout.buffer
    check_script_exists(cluster, spec)
    if not dry_run and (os.path.exists(os.path.join(options.run_dir, options.run_id))):
        raise ConfigError(
            f"run {options.run_id!r} already exists in {options.run_dir}; choose another --run-id"
        )
    if detach and not dry_run:
        return launch_detached(cluster, spec, options, out)
    return _launch(cluster, spec, options, dry_run, out, out)


def launch_detached(cluster: Cluster, spec: JobSpec, options: LaunchOptions, out: BinaryIO) -> int:
    """Start the run with a background controller; return once every node runs."""
    log_path = os.path.join(options.run_dir, f".{options.run_id}.controller.log")

    def work(report) -> int:
        return _launch(
            cluster,
            spec,
            options,
            False,
            None,
            open(os.devnull, "wb"),
            on_started=lambda: report({"started": True}),
        )

    result = run_detached(work, log_path)
    if "error" in result:
        out.write(f"orchestrator: error: {result['error']}\n".encode())
        out.flush()
        return int(result.get("exit_code") or 1)
    run_dir = options.run_dir
    out.write(
        (
            f"run {options.run_id} started in the background\n"
            f"  follow it:  orchestrator logs {options.run_id} -f --run-dir {run_dir}\n"
            f"  state:      orchestrator status {options.run_id} --run-dir {run_dir}\n"
            f"  stop it:    orchestrator stop {options.run_id} --run-dir {run_dir}\n"
        ).encode()
    )
    out.flush()
    return 0


def _launch(
    cluster: Cluster,
    spec: JobSpec,
    options: LaunchOptions,
    dry_run: bool,
    console: BinaryIO | None,
    notes: BinaryIO,
    on_started: Callable[[], None] = lambda: None,
) -> int:
    out = notes

    def note(text: str) -> None:
        try:
            out.write(f"[orchestrator] {text}\n".encode())
            out.flush()
        except OSError:  # the terminal went away (SIGHUP): the run and its record go on
            pass

    connections = connect_cluster(cluster, options.ssh)
    try:
        plan, scripts = prepare(cluster, spec, options, connections, note)
        if dry_run:
            out.write(dry_run_text(plan, scripts).encode())
            out.flush()
            return 0
        record = RunRecord.create(options.run_dir, options.run_id)
        write_rendered(record.path, plan, scripts)
        sync_code(plan, connections, note)
        outcome = run_plan(plan, scripts, spec, options, connections, record, console, on_started)
        return outcome.exit_code
    finally:
        close_all(connections)
