"""--sync: the directory copied into every node's run folder before the job starts."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from orchestrator.backends.base import NodeConnection
from orchestrator.console.progress import Progress
from orchestrator.errors import NodeError, NodeErrors
from orchestrator.hostlist import compress_hosts
from orchestrator.plan.launch_plan import LaunchPlan


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
