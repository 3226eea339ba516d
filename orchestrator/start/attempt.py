"""The stages of one attempt of a launch, each given what it needs (launcher.run_plan runs
them in order): the secrets and their mask, the run's node and rank states, the console's
sink, the agents' configs, and the record's last word once the attempt ended."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from orchestrator.agent.bootstrap import stack_hook_source
from orchestrator.backends.base import NodeConnection
from orchestrator.console.footer import Footer
from orchestrator.console.sink import LogSink, use_color
from orchestrator.nodes.copies import node_copies
from orchestrator.nodes.refill import complete_rank_files
from orchestrator.options.display import ConsoleOptions
from orchestrator.options.supervision import Supervision
from orchestrator.plan.launch_plan import LaunchPlan, NodePlan
from orchestrator.plan.scripts import script_name
from orchestrator.plan.spec import JobSpec, inherited_secrets
from orchestrator.record.runs import RunRecord, ended_status
from orchestrator.record.states import NodePhase
from orchestrator.supervise import NodeState, Outcome
from orchestrator.supervise.state import States, states_of


@dataclass(frozen=True)
class Secrets:
    """The job's secrets: handed to the agents by name (`env`), masked in every line."""

    env: dict[str, str]
    values: tuple[str, ...]  # every value to mask, longest first

    def mask(self, data: bytes) -> bytes:
        for value in self.values:
            data = data.replace(value.encode(), b"***")
        return data


def secrets_of(spec: JobSpec, plan: LaunchPlan) -> Secrets:
    env = {k: v for k, v in spec.env if k in plan.secret_names}
    # A job on this machine inherits its environment, secrets included (HF_TOKEN=...).
    inherited = inherited_secrets() if plan.is_local else []
    values = sorted({v for v in [*env.values(), *inherited] if v}, key=len, reverse=True)
    return Secrets(env, tuple(values))


def plan_states(plan: LaunchPlan) -> States:
    """The plan's nodes and ranks as supervision starts them."""
    return states_of((node.name, node.ranks) for node in plan.nodes)


def console_sink(
    logs_dir: Path,
    states: States,
    console: BinaryIO | None,
    mask: Callable[[bytes], bytes],
    shown: ConsoleOptions,
) -> LogSink:
    """Where every line goes: the run's log files and, when attached, the console."""
    return LogSink(
        logs_dir,
        states.rank_labels,
        states.node_labels,
        console,
        use_color(sys.stdout, shown.color),
        mask=mask,
        fold=shown.fold,
        footer=Footer.on(console) if shown.footer else None,
    )


def agent_starts(
    plan: LaunchPlan,
    scripts: dict[str, str],
    connections: Sequence[NodeConnection],
    secrets: Secrets,
    supervision: Supervision,
) -> list[tuple]:
    """(node rank, connection, python, run id, the agent's config) for every node."""
    return [
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
                "env": secrets.env,
                "secrets": list(secrets.values),
                "grace": supervision.grace,
                "heartbeat_timeout": supervision.heartbeat_timeout,
                "stall_timeout": supervision.stall_timeout,
                "stack_hook": stack_hook_source(),
                **container_config(plan, node),
            },
        )
        for node, connection in zip(plan.nodes, connections, strict=True)
    ]


def container_config(plan: LaunchPlan, node: NodePlan) -> dict[str, dict[str, str]]:
    """With --container: which runtime and name the agent removes the node's container by."""
    if plan.container is None:
        return {}
    return {"container": {"runtime": node.container_runtime, "name": node.container_name}}


def nodes_started(nodes: Sequence[NodeState]) -> tuple[int, int]:
    """How many nodes got past starting (their script runs or ended), and how many failed."""
    past = [node for node in nodes if node.state != NodePhase.STARTING]
    return len(past), sum(node.state in (NodePhase.FAILED, NodePhase.LOST) for node in past)


def record_the_end(
    plan: LaunchPlan,
    connections: Sequence[NodeConnection],
    sink: LogSink,
    record: RunRecord,
    outcome: Outcome,
    status: dict,
    *,
    ssh: object,
    keep_node_logs: bool,
    run_dir: str,
    carry: Callable[[dict], dict],
) -> None:
    """After an attempt: the rank files the record could not take whole (its disk filled)
    completed from the nodes' copies, which then stay while any is still incomplete; the
    other copies kept or removed; status.json's last word (`status`, the outcome, and what
    `carry` keeps of the incomplete files across attempts)."""
    completion = complete_rank_files(plan, connections, sink)
    leftover = completion.status(ssh)
    copies = completion.kept_copies(plan.run_id) or node_copies(
        plan, keep_node_logs, outcome.state, connections, sink.note
    )
    status_error = record.write_status(
        {
            **status,
            **ended_status(outcome.state, outcome.exit_code, outcome.summary or None),
            "node_copies": copies,
            **carry(leftover),
        }
    )
    for line in completion.lines(plan.run_id, run_dir, status_error):
        sink.note(line)
    if status_error is not None:
        sink.report_fault(status_error, record.status_path)
    sink.close()
