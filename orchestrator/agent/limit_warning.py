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

# Type names only, not imported at run time (see processes.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def rank_targets(root_pid: int) -> dict[int, list[int]]:
    """rank -> the processes a warning for it goes to: its Python program, or what
    run_rank's bash started where it is not Python (never torchrun)."""
    return {
        rank: [pid] if is_python(pid) else children_of(pid)
        for rank, pid in rank_pids(root_pid).items()
    }


class HeldWarning:
    """The warning SLURM sent to every process of the step at once (srun passes it on):
    a rank still starting then (importing torch, before its handler) ignored it, so it is
    held here and sent to each rank's process once that catches it. `seen` is what caught
    it when it came (signalled then; never twice), `targets` the rank processes now."""

    def __init__(self, signum: int, seen: set[int]) -> None:
        self.signum = signum
        self.seen = set(seen)

    def deliver(
        self,
        targets: dict[int, list[int]],
        catching: Callable[[int, int], bool] = catches,
        send: Callable[[int, int], None] = signal_pid,
    ) -> list[int]:
        """Send the signal to the rank processes that catch it now and have not had it;
        the ranks it went to."""
        went = []
        for rank, pids in targets.items():
            late = [p for p in pids if p not in self.seen and catching(p, self.signum)]
            for pid in late:
                send(pid, self.signum)
                self.seen.add(pid)
            if late:
                went.append(rank)
        return went


def catching_now(targets: dict[int, list[int]], signum: int) -> set[int]:
    """The rank processes among `targets` that catch `signum` now."""
    return {p for pids in targets.values() for p in pids if catches(p, signum)}


def warn_ranks(root_pid: int, name: str) -> bytes:
    """`signal USR1|USR2`, the time limit's warning, to each rank's process (`rank_pids`:
    its Python program, or what run_rank's bash started where it is not Python), never to
    torchrun, which would not pass it on. Only to a process that catches it: its default
    action would end the process; one that does not runs on to the limit, as under SLURM.
    The G frame: this node's clock before the first signal, the ranks sent it, the others."""
    signum = int(getattr(signal, f"SIG{name}")) if name in ("USR1", "USR2") else 0
    when, sent, skipped = time.time(), [], []
    for rank, targets in rank_targets(root_pid).items():
        catching = [p for p in targets if signum and catches(p, signum)]
        for each in catching:
            signal_pid(each, signum)
        (sent if catching else skipped).append(str(rank))
    return frame(
        Frame.TIME_WARNING, name, f"{when:.6f}", ",".join(sent) or "-", ",".join(skipped) or "-"
    )
