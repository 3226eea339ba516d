"""The node agents of the SLURM attempt a follower follows, as it hears them.

One session per node, all fed by one `srun --overlap` step over the allocation
(orchestrator.slurm.following.agents), their frames in one queue in each node's stream
order. Each pass of the loop (orchestrator.supervise.run_loop) the follower hands them on:
the ranks' lines, metrics, node samples, stacks and messages to the frame handlers as over
SSH; a rank's or the node's end to the follower's own judgement (SLURM, not the agents, ends
the step on every node). How far each node's stream was handled goes to the follower's
bookmarks (orchestrator.slurm.following.handover). A channel that closes while its node runs (its
dial or the whole step ended under it) is dialled again from there: at once the first time,
then at most every REDIAL_S; by the step's task on the node while that step runs, else by
a new step for all the nodes due at once.
"""

from __future__ import annotations

import queue
import time
from typing import Protocol

from orchestrator.agent.protocol import Frame
from orchestrator.backends.sessions import CHANNEL_CLOSED, Event, NodeSession
from orchestrator.slurm.control.client import SlurmCommands
from orchestrator.slurm.following.agents import AllocationStep, leave_steps
from orchestrator.slurm.following.handover import Bookmarks
from orchestrator.supervise import NodeState, Supervisor
from orchestrator.supervise.frame_handlers import handle as handle_event

REDIAL_S = 5.0


class Judge(Protocol):
    """What the follower decides itself (SLURM, not the agents, ends the step)."""

    def rank_exited(
        self, rank: int, code: int, when: float, after_stop: bool | None = None
    ) -> None: ...

    def node_exited(self, node: NodeState, code: int | None, when: float) -> None: ...

    def warned(self, signal_name: str, when: float) -> None: ...

    def channel_closed(self, node: int) -> None: ...


class NodeAgents:
    """The sessions to one attempt's node agents, and the queue of their frames."""

    def __init__(
        self,
        job_id: int,
        attempt: int,
        python: str,
        bookmarks: Bookmarks,
        events: queue.Queue[Event | None],
        commands: SlurmCommands | None = None,
        kept_on_node: str | None = None,
    ) -> None:
        self.job_id, self.attempt, self.python = job_id, attempt, python
        self.bookmarks = bookmarks
        self.commands = commands  # where srun runs: here, or on the --login node
        self.connected: set[int] = set()  # the nodes whose agent has answered
        self.unreached: set[int] = set()  # the nodes whose files say it instead
        self.sessions: list[NodeSession] = []  # the attempt's Supervisor holds this list
        self.steps: list[AllocationStep] = []  # srun steps: one, or more after one ended
        self.step_of: dict[int, AllocationStep] = {}  # node -> the step that reaches it
        self.said_over: list[AllocationStep] = []  # the steps whose end was told
        self.events = events  # the attempt's: the follower waits on it (None: a wake-up)
        self.redial_at: dict[int, float] = {}  # node -> when its agent is dialled again
        # The attempt's folder on the nodes where the run record is not shared with them
        # (batch/node_files.py): a node whose agent is never reached keeps its lines there.
        self.kept_on_node = kept_on_node

    def reach(self, hosts: list[str], offsets: dict[str, int] | None) -> None:
        """Dial every node's agent, node K's stream from offsets[str(K)] (else its start),
        all through one step."""
        self.sessions.extend([None] * len(hosts))  # type: ignore[list-item]
        offered = {index: (offsets or {}).get(str(index), 0) for index in range(len(hosts))}
        self._step(dict(enumerate(hosts)), offered)

    def _step(self, hosts: dict[int, str], offsets: dict[int, int]) -> None:
        step = AllocationStep(
            self.job_id, self.attempt, hosts, self.python, self.events, offsets, self.commands
        )
        self.steps.append(step)
        for index, session in step.sessions.items():
            self.sessions[index] = session
            self.step_of[index] = step

    def leave(self) -> None:
        leave_steps(self.steps)

    def hand_on(self, sup: Supervisor, event: Event, judge: Judge, running: bool) -> None:
        """One frame of a node's, in that node's order (the loop's pass takes them from the
        queue); `running`: the job runs (a channel that closed is dialled again only then)."""
        node = sup.nodes[event.node]
        if event.kind == CHANNEL_CLOSED:
            judge.channel_closed(node.index)
            self._lost(sup, node, event, running)
            return
        if event.kind == Frame.RANK_EXITED:  # E rank rc t [stopped]
            node.heard(event.at)
            rank, code, at, *stopped = event.fields
            after_stop = stopped[0] == "1" if stopped else None
            judge.rank_exited(int(rank), int(code), sup.on_our_clock(node, float(at)), after_stop)
        elif event.kind == Frame.FINISHED:  # X rc t: the node's part ended
            node.heard(event.at)
            code = None if event.fields[0] == "None" else int(event.fields[0])
            judge.node_exited(node, code, sup.on_our_clock(node, float(event.fields[1])))
        elif event.kind == Frame.TIME_WARNING and event.fields[2:] == ("-", "-"):
            # G SIG t - -: the keeper heard the time limit's (or a preemption's) signal
            judge.warned(event.fields[0], sup.on_our_clock(node, float(event.fields[1])))
        else:
            handle_event(sup, event)
        self.bookmarks.heard(event.node, self.sessions[event.node].channel, event.end)

    def _lost(self, sup: Supervisor, node: NodeState, event: Event, running: bool) -> None:
        """A closed channel: a node whose agent never answered is read from its files from
        now on (said once, with why); one that had answered is dialled again."""
        if node.done or sup.stopping or not running:
            return
        why = event.data.decode(errors="replace").strip() or "it ended"
        if self.sessions[node.index].channel.connected:  # type: ignore[attr-defined]
            self.connected.add(node.index)
        if node.index not in self.connected:
            self.unreached.add(node.index)
            instead = (
                "are read from the run's job folder instead"
                if self.kept_on_node is None
                else f"stay on the node, in {self.kept_on_node}/node{node.index} (the run "
                "folder is not on a file system the nodes share), with its exits"
            )
            sup.sink.node_note(
                node.host,
                f"no way to its agent ({why.splitlines()[-1]}): its ranks' lines {instead}, "
                "with no stacks or hang checks there",
            )
            return
        again = node.index in self.redial_at
        step = self.step_of[node.index]
        if step.over:  # the whole step ended: said once for all its nodes
            if step not in self.said_over:
                self.said_over.append(step)
                sup.sink.note(f"the step to the node agents ended: {why}; dialling again")
        elif not again:
            sup.sink.node_note(node.host, f"its agent's channel closed: {why}; dialling again")
        self.redial_at[node.index] = time.monotonic() + (REDIAL_S if again else 0.0)

    def redial(self, sup: Supervisor, running: bool) -> None:
        """After a pass: dial again the agents whose channel closed while their node runs,
        through the step that reaches them while it runs, the others in one new step."""
        anew: dict[int, str] = {}
        for index, at in self.redial_at.items():
            node = sup.nodes[index]
            if node.done or sup.stopping or not running or at > time.monotonic():
                continue
            step = self.step_of[index]
            offset = self.bookmarks.agents.get(str(index), 0)
            if not step.over:
                self.sessions[index] = step.redial(index, node.host, offset)
            else:
                anew[index] = node.host
            self.redial_at[index] = float("inf")  # until this one closes too
        if anew:
            self._step(anew, {i: self.bookmarks.agents.get(str(i), 0) for i in anew})
