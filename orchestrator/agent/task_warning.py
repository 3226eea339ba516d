"""The SLURM task's rules for the time limit's warning (or a preemption's) on its node: the
G frame that tells the launcher, the warning held for ranks still starting when it came, and
the task's exit after it (0, its code kept in a file), so that srun's --kill-on-bad-exit spares
the nodes whose ranks still save (keeper.py).

Standard library only: this module runs on the nodes (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from orchestrator.agent.limit_warning import HeldWarning, rank_targets
from orchestrator.agent.protocol import Frame, frame

# Type names only, not imported at run time (see processes.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from orchestrator.agent.main import Agent

HELD_POLL_S = 0.1  # after the warning: how often ranks that ignored it are looked for


def warned_frame(signum: int) -> bytes:
    """G SIG t - -: the time limit's (or a preemption's) signal reached this node's step
    (the batch script passes it on to every rank; how many were sent is not ours to
    count, hence the dashes the agent's own G frame has numbers in)."""
    name = signal.Signals(signum).name.removeprefix("SIG")
    return frame(Frame.TIME_WARNING, name, f"{time.time():.6f}", "-", "-")


def hold(came: list[HeldWarning], agent: Agent, done: threading.Event) -> None:
    """Once the warning came, send it to each rank that starts catching it later (a rank
    still importing its libraries when SLURM sent it ignored it), and say so."""
    while not done.wait(HELD_POLL_S):
        if not came:
            continue
        agent.warned = True
        for rank in came[0].deliver(rank_targets(os.getpid())):
            name = signal.Signals(came[0].signum).name
            agent.outbox.message(
                f"rank {rank} was still starting when {name} came: sent it now that it catches it"
            )


def stopped_on_warning(path: str, rc: int) -> int:
    """The step's end after the warning, with the script's nonzero code `rc` (the ranks
    saved and stopped, e.g. 138): not a failure of this node, so srun's task ends 0 and
    srun (--kill-on-bad-exit) does not end the step on the nodes whose ranks still save.
    The code is kept beside the socket (`stopped_file`): the batch script, on node 0,
    ends with it."""
    try:
        with open(stopped_file(path), "w") as out:
            out.write(f"{rc}\n")
    except OSError as error:
        print(f"orchestrator agent: cannot keep the exit code {rc}: {error}", file=sys.stderr)
    return 0


def stopped_file(path: str) -> str:
    """Where the keeper whose socket is `path` keeps its script's code after the warning."""
    return path.removesuffix(".sock") + ".stopped"
