"""--min-nodes growing back: while a run goes on without nodes a fault took out, each is
asked now and then whether it answers SSH again (every 30 s, or twice the heartbeat
timeout if less). One that does joins at the next checkpoint: the ranks are sent the time
limit's warning signal (the bundled trainer saves a checkpoint and exits 138 on it), and
the launcher starts the job again on the larger world, never more nodes than launched."""

from __future__ import annotations

import threading
from dataclasses import replace

from orchestrator.backends import connect_each
from orchestrator.start.pool import NodePool
from orchestrator.start.settings import LaunchOptions
from orchestrator.supervise import Supervisor

ASK_EVERY_S = 30.0


def ask_interval(heartbeat_timeout: float) -> float:
    """How often a node left out is asked whether it answers again."""
    return min(ASK_EVERY_S, 2 * heartbeat_timeout) if heartbeat_timeout > 0 else ASK_EVERY_S


def watch_returns(pool: NodePool, options: LaunchOptions, supervisor: Supervisor) -> None:
    """Ask the nodes the run left out, in a thread of its own, until the attempt ends. Not
    with --time over SSH: there the warning signal belongs to the time limit."""
    if not pool.gone or options.deadline.limit_s is not None:
        return
    every = ask_interval(options.supervision.heartbeat_timeout)

    def ask() -> None:
        while not supervisor.ended.wait(every):
            for member in list(pool.gone):
                cluster = replace(pool.base, hosts=(member.host,), spares=())
                try:
                    connections, errors = connect_each(cluster, options.ssh)
                except Exception:  # not back yet, whatever the way it failed
                    continue
                if errors or connections[0] is None:
                    continue
                size = pool.answered(member.host.name, connections[0])
                if supervisor.ended.is_set():
                    return
                supervisor.sink.note(
                    f"{member.host.name} back; growing to {size} nodes at the next checkpoint"
                )
                supervisor.ask_checkpoint(f"growing to {size} nodes")

    threading.Thread(target=ask, name="regrow", daemon=True).start()
