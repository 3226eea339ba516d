"""How often the SLURM follower (follow.py) asks squeue and reads the nodes' files.

squeue is a process and a request to slurmctld: about 6 ms of the controller's CPU each
(benchmarks/slurm_agents.py), so once a second it was most of what a quiet job cost. Once
every node's agent answers, whatever of SLURM's that matters shows without it: the job's
end, a requeue, a node failure or a cancel ends the job's steps, so the agents' channels
(`srun --overlap` steps of the job) close; the agents tell the ranks' and nodes' ends and
the time limit's warning as they come. squeue then runs every AGENTS_POLL_S,
a backstop for what shows in none of these; and every POLL_S, as before, while the job is
queued, while any agent has not answered yet or has gone quiet, once a channel has closed,
a node has ended or a stop has begun (the follower asks at once on an exit or a warning).

An agent under SLURM says something at least every SLOWEST_BEAT_S (its steady heartbeat:
the keeper's heartbeat timeout is 0), so one silent for HEARD_S, two beats, counts as not
answering. AGENTS_POLL_S is as long: a job gone in a way that shows nowhere else (a step's
srun on this machine stuck while the agent is gone) is seen within two beats either way,
and squeue costs one process per 30 s whatever the node count.

The follower passes every FILES_S while something comes (the agents' frames, or the nodes'
files over --login, the batch script's output); each pass that finds nothing doubles the
pause, up to FILES_IDLE_S (as the agent's own loop does): a job that prints shows its lines
within FILES_S, the first line after a quiet spell within FILES_IDLE_S. The follower waits
on its events meanwhile, so the agents' frames (stacks, messages, a closed channel) and a
signal are handled as they come, not at the next pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.agent.protocol import SLOWEST_BEAT_S
from orchestrator.backends.sessions import NodeSession
from orchestrator.supervise import Supervisor

POLL_S = 1.0  # squeue this often until every agent answers, and once something ends
AGENTS_POLL_S = 30.0  # squeue this often while every agent answers
HEARD_S = 2 * SLOWEST_BEAT_S  # an agent silent this long no longer answers
FILES_S = 0.1  # the nodes' files this often while they grow
FILES_IDLE_S = 1.0  # at most this long between passes that find nothing


class Cadence:
    """When the next squeue and the next pass over the files are due (monotonic time)."""

    def __init__(self) -> None:
        self.polled = float("-inf")  # the last squeue
        self.steady = False  # at the last squeue's turn: every agent answered, nothing ended
        self.files_pause = FILES_S
        # Each agent's session, and its reader's `heard` when it was reached: it answers
        # once that has moved (the dial's first bytes), and while it keeps moving.
        self.agents: list[tuple[NodeSession, float]] = []
        self.closed: set[int] = set()  # the nodes whose channel closed

    def reached(self, sessions: Sequence[NodeSession]) -> None:
        """The agents of a new attempt."""
        self.agents = [(session, session.heard) for session in sessions]
        self.closed = set()

    def channel_closed(self, node: int) -> None:
        self.closed.add(node)

    def answering(self, now: float) -> bool:
        """Every agent has said something, within HEARD_S, and its channel is open (its
        reader also ends on the agent's last frame, X)."""
        return bool(self.agents) and all(
            session.index not in self.closed
            and session.reading
            and session.heard != at
            and now - session.heard < HEARD_S
            for session, at in self.agents
        )

    def squeue_now(self, now: float, sup: Supervisor | None) -> bool:
        """Whether squeue is due now (the next is then counted from now): at once when
        the job stops being steady (a channel closed, an agent went quiet, a node ended, a
        stop began)."""
        nothing_ended = sup is not None and not sup.stopping and not any(n.done for n in sup.nodes)
        steady = nothing_ended and self.answering(now)
        left, self.steady = self.steady and not steady, steady
        due = left or now - self.polled >= self.poll_every()
        if due:
            self.polled = now
        return due

    def poll_every(self) -> float:
        return AGENTS_POLL_S if self.steady else POLL_S

    def poll_now(self) -> None:
        """Something squeue may show next has happened (an exit, a warning): ask at once."""
        self.polled = float("-inf")

    def files_read(self, came: bool) -> None:
        """A pass over the files ended; `came`: it found something (or lines are held)."""
        self.files_pause = FILES_S if came else min(FILES_IDLE_S, self.files_pause * 2)

    def pause(self, now: float) -> float:
        """How long the follower may wait for an event before its next pass."""
        return max(0.0, min(self.files_pause, self.polled + self.poll_every() - now))
