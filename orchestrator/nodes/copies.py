"""The nodes' copies of a run: what each node keeps under ~/.orchestrator/runs/RUN.

Every node writes its ranks' output, their exits and its node script there, and its agent
ships all of it to the controller's run record as the run goes. Once a run has succeeded
and the record here holds every node's part, the copies are removed (`remove_copies`),
unless --keep-node-logs. The copies of a run that failed, stopped or was lost stay, for a
look at what the controller may not have received; `orchestrator clean` (clean.py) removes
the copies of ended runs, on every node of a hostfile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestrator.backends.base import NodeConnection
from orchestrator.hostlist import compress_hosts
from orchestrator.nodes.execute import last_line, run_on_nodes
from orchestrator.plan.launch_plan import NODE_RUNS_DIR, LaunchPlan
from orchestrator.record.states import RunState

REMOVE_TIME_LIMIT_S = 60.0
# Run by sh in the node's home ($1: the node directory, relative to it): its parent, the
# run's directory, goes too once no other node of the run on this host still has its own.
REMOVE_COPY = 'rm -rf -- "$1" && { rmdir -- "$(dirname -- "$1")" 2>/dev/null; true; }'


def copy_path(node_dir: str) -> str:
    """A node directory (~/.orchestrator/runs/RUN/nodeK) relative to the node's home."""
    return node_dir[2:] if node_dir.startswith("~/") else node_dir


def node_copies(
    plan: LaunchPlan,
    keep: bool,
    state: RunState,
    connections: Sequence[NodeConnection],
    note: Callable[[str], None],
) -> str:
    """Remove the nodes' copies of a run that succeeded (this machine's record now holds
    all of it) unless `keep` (--keep-node-logs); say where they are, or what became of them."""
    where = f"~/{NODE_RUNS_DIR}/{plan.run_id} on each node"
    if keep:
        return f"kept (--keep-node-logs): {where}"
    if state != RunState.SUCCEEDED:
        return f"kept (the run {state}; `orchestrator clean` removes them): {where}"
    # After a relaunch, the nodes may hold copies of earlier attempts too: all of the run goes.
    dirs = [
        node.node_dir if plan.attempt == 1 else f"~/{NODE_RUNS_DIR}/{plan.run_id}"
        for node in plan.nodes
    ]
    pythons = [node.python for node in plan.nodes]
    failed = by_reason(remove_copies(connections, pythons, dirs, plan.run_id))
    for hosts, why in failed:
        note(f"warning: could not remove the node's copy of the run: {hosts}: {why}")
    return (
        f"removed, except on: {'; '.join(f'{h}: {w}' for h, w in failed)}" if failed else "removed"
    )


def by_reason(failed: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """(host, why) folded to (host list, why), one per reason, in order of first appearance:
    at 256 nodes one reason is one line, not 211 (`ceon[1-3,7]`, SLURM's syntax)."""
    hosts: dict[str, list[str]] = {}
    for host, why in failed:
        hosts.setdefault(why, []).append(host)
    return [(compress_hosts(names), why) for why, names in hosts.items()]


def remove_copies(
    connections: Sequence[NodeConnection],
    pythons: Sequence[str],
    node_dirs: Sequence[str],
    run_id: str,
) -> list[tuple[str, str]]:
    """Remove each node's copy of run `run_id`; what could not be removed, as (host, why).
    The agents are tagged with the run's id, so the ones its job left idle do it."""
    results = run_on_nodes(
        connections,
        pythons,
        [["sh", "-c", REMOVE_COPY, "sh", copy_path(d)] for d in node_dirs],
        time_limit=REMOVE_TIME_LIMIT_S,
        tag=run_id,
        what="removing the nodes' copies",
    )
    return [(r.host, f"{r.describe()}{last_line(r)}") for r in results if not r.ok]
