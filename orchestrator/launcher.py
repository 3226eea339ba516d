"""Launch a job: connect -> probe -> plan -> render -> run record -> start agents -> supervise.

The one place where the steps of the data flow meet; each step is a call into its module.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from orchestrator.backends.base import NodeConnection
from orchestrator.errors import ConfigError
from orchestrator.hostfile import Cluster
from orchestrator.logs import LogSink, use_color
from orchestrator.nodes import Event, NodeSession
from orchestrator.plan import LaunchPlan, NodeFacts, make_plan
from orchestrator.probe import probe_nodes
from orchestrator.render import (
    command_line,
    plan_yaml,
    render_node_scripts,
    script_name,
    write_rendered,
)
from orchestrator.runs import RunRecord, now_iso, process_start_time
from orchestrator.spec import JobSpec
from orchestrator.supervise import NodeState, Outcome, RankState, Supervisor

NODE_DIR = "~/.orchestrator/runs/{run_id}/node{node_rank}"


@dataclass(frozen=True)
class LaunchOptions:
    run_dir: str
    run_id: str
    argv: tuple[str, ...]  # the orchestrator command line, for script headers
    grace: float = 10.0
    heartbeat_timeout: float = 30.0
    color: str = "auto"
    preflight: bool = True
    ssh: object | None = None  # orchestrator.backends.ssh.SshOptions


def connect(cluster: Cluster, options: LaunchOptions) -> list[NodeConnection]:
    """Open a connection to every node (SSH ones in parallel); local hosts need none."""
    from orchestrator.backends.local import LocalConnection

    if cluster.is_local:
        return [LocalConnection(host.name) for host in cluster.hosts]
    from orchestrator.backends.ssh import connect_all

    return connect_all(cluster.hosts, options.ssh)


def close_all(connections: Sequence[NodeConnection]) -> None:
    for connection in connections:
        with contextlib.suppress(Exception):
            connection.close()


def prepare(cluster: Cluster, spec: JobSpec, options: LaunchOptions,
            connections: Sequence[NodeConnection] | None,
            note=lambda text: None) -> tuple[LaunchPlan, dict[str, str]]:
    """Probe (when connected), plan and render; nothing starts."""
    facts: dict[str, NodeFacts] = {}
    if connections is not None and options.preflight:
        result = probe_nodes(cluster, spec, connections)
        facts = result.facts
        for host, fact in facts.items():
            note(f"{host}: python {fact.python_version}, torch {fact.torch_version}")
        for warning in result.warnings:
            note(f"warning: {warning}")
    plan = make_plan(cluster, spec, options.run_id, facts)
    scripts = render_node_scripts(plan, command_line(options.argv, plan.secret_names))
    return plan, scripts


def dry_run_text(plan: LaunchPlan, scripts: dict[str, str]) -> str:
    parts = ["# plan.yaml", plan_yaml(plan)]
    for node in plan.nodes:
        parts += [f"# ---- {script_name(node)} (runs on {node.name}) ----",
                  scripts[script_name(node)]]
    return "\n".join(parts)


def check_script_exists(cluster: Cluster, spec: JobSpec) -> None:
    """When every node is this machine, a missing script is caught before anything starts."""
    program = spec.program
    if program.is_module or not cluster.is_local:
        return
    path = program.target if os.path.isabs(program.target) else \
        os.path.join(spec.workdir, program.target)
    if not os.path.isfile(path):
        raise ConfigError(f"script {program.target!r} not found (looked in {spec.workdir}); "
                          "give its path relative to --workdir or an absolute path")


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
        "controller": {"pid": pid, "start_time": process_start_time(pid),
                       "host": socket.gethostname()},
    }


@contextlib.contextmanager
def signals_to(supervisor: Supervisor) -> Iterator[None]:
    """Route SIGINT/SIGTERM to the supervisor for the duration of a run."""
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, lambda num, _frame: supervisor.interrupt(num))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_plan(plan: LaunchPlan, scripts: dict[str, str], spec: JobSpec,
             options: LaunchOptions, connections: Sequence[NodeConnection],
             record: RunRecord, console: BinaryIO | None) -> Outcome:
    """Start every node's agent with its script and supervise the run to its end."""
    secrets = {k: v for k, v in spec.env if k in plan.secret_names}
    secret_values = sorted({v for v in secrets.values() if v}, key=len, reverse=True)

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
    sink = LogSink(record.logs_dir, rank_labels, node_labels, console,
                   use_color(sys.stdout, options.color), mask=mask)
    backend = "local" if plan.is_local else "ssh"
    base = base_status(plan, options, backend)
    events: queue.Queue[Event] = queue.Queue(maxsize=4096)
    sessions: list[NodeSession] = []

    def on_change(sup: Supervisor) -> None:
        state = "stopping" if sup.stopping else "running"
        record.write_status({**base, "state": state, **sup.status()})

    sink.note(f"run {plan.run_id}: {plan.world_size} rank(s) on {plan.nnodes} node(s), "
              f"master {plan.master_addr}:{plan.master_port}; logs in {record.logs_dir}")
    supervisor = Supervisor(nodes, ranks, sessions, events, sink, grace=options.grace,
                            heartbeat_timeout=options.heartbeat_timeout, on_change=on_change)
    started = time.monotonic()
    try:
        with signals_to(supervisor):
            for node, connection in zip(plan.nodes, connections, strict=True):
                config = {
                    "run_id": plan.run_id,
                    "node_dir": NODE_DIR.format(run_id=plan.run_id, node_rank=node.node_rank),
                    "script": scripts[script_name(node)],
                    "script_name": script_name(node),
                    "ranks": list(node.ranks),
                    "env": secrets,
                    "secrets": secret_values,
                    "grace": options.grace,
                    "heartbeat_timeout": options.heartbeat_timeout,
                }
                sessions.append(NodeSession.start(node.node_rank, connection, node.python,
                                                  plan.run_id, config, events))
            outcome = supervisor.run()
    finally:
        for session in sessions:
            session.close()
    elapsed = time.monotonic() - started
    if outcome.state == "succeeded":
        sink.note(f"run {plan.run_id} succeeded in {elapsed:.1f} s")
    else:
        sink.note(outcome.summary)
        sink.note(f"run {plan.run_id} {outcome.state} (exit code {outcome.exit_code}) "
                  f"after {elapsed:.1f} s; logs in {record.logs_dir}")
    sink.close()
    record.write_status({**base, **supervisor.status(), "state": outcome.state,
                         "exit_code": outcome.exit_code, "ended_at": now_iso(),
                         "summary": outcome.summary or None})
    return outcome


def launch(cluster: Cluster, spec: JobSpec, options: LaunchOptions, *, dry_run: bool = False,
           out: BinaryIO | None = None) -> int:
    """The whole launch; returns the exit code. Raises OrchestratorError for bad input."""
    out = out or sys.stdout.buffer

    def note(text: str) -> None:
        out.write(f"[orchestrator] {text}\n".encode())
        out.flush()

    check_script_exists(cluster, spec)
    if not dry_run and (os.path.exists(os.path.join(options.run_dir, options.run_id))):
        raise ConfigError(f"run {options.run_id!r} already exists in {options.run_dir}; "
                          "choose another --run-id")
    connections = connect(cluster, options)
    try:
        plan, scripts = prepare(cluster, spec, options, connections, note)
        if dry_run:
            out.write(dry_run_text(plan, scripts).encode())
            out.flush()
            return 0
        record = RunRecord.create(options.run_dir, options.run_id)
        write_rendered(record.path, plan, scripts)
        outcome = run_plan(plan, scripts, spec, options, connections, record, out)
        return outcome.exit_code
    finally:
        close_all(connections)
