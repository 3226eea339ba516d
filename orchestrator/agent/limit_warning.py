"""The time limit's warning on this node: the signal ahead of --time, sent to each rank's
own process (torchrun would not pass it on to its workers), answered by a G frame.

Standard library only: this module runs on the nodes too (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import signal
import time

from orchestrator.agent.processes import children_of, signal_pid
from orchestrator.agent.protocol import Frame, frame
from orchestrator.agent.ranks import is_python, rank_pids
from orchestrator.agent.stacks import catches


def warn_ranks(root_pid: int, name: str) -> bytes:
    """`signal USR1|USR2`, the time limit's warning, to each rank's process (`rank_pids`:
    its Python program, or what run_rank's bash started where it is not Python), never to
    torchrun, which would not pass it on. Only to a process that catches it: its default
    action would end the process; one that does not runs on to the limit, as under SLURM.
    The G frame: this node's clock before the first signal, the ranks sent it, the others."""
    signum = int(getattr(signal, f"SIG{name}")) if name in ("USR1", "USR2") else 0
    when, sent, skipped = time.time(), [], []
    for rank, pid in rank_pids(root_pid).items():
        targets = [pid] if is_python(pid) else children_of(pid)
        catching = [p for p in targets if signum and catches(p, signum)]
        for each in catching:
            signal_pid(each, signum)
        (sent if catching else skipped).append(str(rank))
    return frame(
        Frame.TIME_WARNING, name, f"{when:.6f}", ",".join(sent) or "-", ",".join(skipped) or "-"
    )
