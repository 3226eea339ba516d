"""Lost means gone, not busy: telling a dead node from a slow agent or a slow controller.

Silence is counted in the controller's own awake time: each pass of the loop adds the time
since the last one, but never more than MAX_TICK_S, so a controller that was stopped, swapped
out or starved on a loaded login node does not blame the nodes for its own absence. A node
silent for a while is asked whether it is there at all: an SSH keepalive that its sshd
answers proves the node and the link alive (`NodeConnection.answers`), whatever its agent
is doing. So, for a node whose agent has said nothing for `heartbeat_timeout`:
- its sshd answered a keepalive since the agent fell silent, within the heartbeat timeout:
  it is busy or frozen, not gone; say so once and wait, up to `stall_timeout` of silence;
- or its sshd did not, but the node's kernel acknowledged our packets (TCP) within the
  heartbeat timeout: the machine is up and the link carries, its sshd is starved (seen at
  250 nodes on a machine swapping hard): the same, busy, not gone;
- otherwise it is lost: the node is down or its link is cut.
Keepalives go out from ASK_AFTER (half) of the heartbeat timeout's silence on: an agent's
steady beats come three times per timeout (agent/protocol.py), so a node is asked only
once its agent is late by a sixth of the timeout, and a dead node is still declared lost
within the heartbeat timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from orchestrator.supervise.state import NodeState

MAX_TICK_S = 3.0  # the most one pass of the loop counts, however late (one comes every 2 s)
CHECK_S = 0.5  # how often silence is looked at
ASK_AFTER = 0.5  # of the heartbeat timeout: the silence from which a node's sshd is asked


class Heard(Protocol):
    """A node's session as liveness sees it: when its reader last got bytes (monotonic)."""

    index: int
    heard: float

    def answers(self) -> bool: ...

    def acknowledged(self, within: float) -> bool | None: ...


class Liveness:
    """Which silent nodes are gone; see the module docstring."""

    def __init__(
        self,
        nodes: Sequence[NodeState],
        sessions: Sequence[Heard],
        notes: Callable[[str], None],
        heartbeat_timeout: float,
        stall_timeout: float,
    ) -> None:
        self.nodes = nodes
        self.sessions = sessions  # the caller may still be adding to it while nodes start
        self.notes = notes
        self.heartbeat_timeout = heartbeat_timeout
        self.stall_timeout = max(stall_timeout, heartbeat_timeout)
        self.awake = 0.0
        self.last_tick = time.monotonic()
        self.last_check = 0.0
        self.seen: dict[int, float] = {}  # node -> the session's `heard` last looked at
        self.heard: dict[int, float] = {}  # node -> awake time its agent was last heard
        self.answer: dict[int, float] = {}  # node -> monotonic time its sshd last answered
        self.answer_seen: dict[int, float] = {}
        self.answered: dict[int, float] = {}  # the same in awake time, once looked at
        self.asked: dict[int, float] = {}  # node -> awake time of the last keepalive sent
        self.probing: set[int] = set()
        self.said_silent: set[int] = set()

    def tick(self, behind: bool = False) -> None:
        """One pass of the controller's loop; `behind`: it has not read all that came."""
        now = time.monotonic()
        if not behind:
            self.awake += min(now - self.last_tick, MAX_TICK_S)
        self.last_tick = now

    def silence(self, node: int) -> float:
        """Awake seconds since the node's agent was last heard."""
        return self.awake - self.heard.get(node, 0.0)

    def alive(self, node: int) -> bool:
        """Heard lately, or its sshd answered since its agent fell silent, lately."""
        if self.silence(node) < self.heartbeat_timeout * ASK_AFTER:
            return True
        answered = self.answered.get(node)
        return (
            answered is not None
            and answered >= self.heard.get(node, 0.0)
            and self.awake - answered <= self.heartbeat_timeout
        )

    def unanswered(self, node: int) -> float:
        """How long the keepalive out to the node has gone without an answer."""
        asked = self.asked.get(node)
        if asked is None or self.answered.get(node, float("-inf")) >= asked:
            return 0.0
        return self.awake - asked

    def check(self, overdue: Callable[[float], bool]) -> list[tuple[NodeState, str, bool]]:
        """(node, why, gone) for each node to count as lost now. `overdue(slack)`: a stop
        began and every agent should have reported `slack` seconds ago."""
        if self.heartbeat_timeout <= 0 or self.awake - self.last_check < CHECK_S:
            return []
        self.last_check = self.awake
        self._note_heard()
        lost = []
        stopped, quiet = overdue(0.0), self.heartbeat_timeout * ASK_AFTER
        for session in list(self.sessions):
            node = self.nodes[session.index]
            if node.done or (not stopped and self.silence(session.index) < quiet):
                continue  # heard lately: nothing to ask or judge (the common case)
            found = self._judge(session, node, overdue)
            if found is not None:
                lost.append((node, *found))
        return lost

    def _judge(
        self, session: Heard, node: NodeState, overdue: Callable[[float], bool]
    ) -> tuple[str, bool] | None:
        index, hb = node.index, self.heartbeat_timeout
        silent = self.silence(index)
        stopped = overdue(0.0)
        if silent >= hb * ASK_AFTER or stopped:
            self._ask(session)
        alive = self.alive(index)
        if stopped:
            alive = alive or session.acknowledged(hb) is True
            if not alive and self.unanswered(index) >= hb / 3:
                return (
                    "its agent did not report back after the stop, and the node does not answer",
                    True,
                )
            if alive and overdue(hb):
                return "its agent did not report back after the stop (the node answers)", False
            return None
        how = "the node answers"
        if silent > hb and not alive:
            if session.acknowledged(hb) is not True:
                why = (
                    f"no word from its agent for {silent:.0f} s and no answer from its sshd "
                    "(node down, or link cut?)"
                )
                return why, True
            how = "its kernel acknowledges every packet (its sshd is too starved to answer)"
        if silent > self.stall_timeout:
            why = (
                f"its agent has been silent for {silent:.0f} s although {how} "
                f"(--stall-timeout {self.stall_timeout:g}): frozen or stuck"
            )
            return why, False
        if silent > hb and index not in self.said_silent:
            self.said_silent.add(index)
            self.notes(
                f"{node.host}: its agent has been silent for {silent:.0f} s, but {how}: "
                f"busy, so waiting up to {self.stall_timeout:g} s (--stall-timeout)"
            )
        return None

    def _note_heard(self) -> None:
        """Turn the readers' and keepalives' monotonic times into awake time."""
        for session in list(self.sessions):
            index = session.index
            if session.heard > self.seen.get(index, -1.0):
                self.seen[index] = session.heard
                self.heard[index] = self.awake
                if index in self.said_silent and not self.nodes[index].done:
                    self.said_silent.discard(index)
                    self.notes(f"{self.nodes[index].host}: its agent is heard again")
            answer = self.answer.get(index)
            if answer is not None and answer != self.answer_seen.get(index):
                self.answer_seen[index] = answer
                self.answered[index] = self.awake

    def _ask(self, session: Heard) -> None:
        """An SSH keepalive to the node's sshd, in the background (it may never answer)."""
        index = session.index
        every = max(1.0, self.heartbeat_timeout / 3)
        if index in self.probing or self.awake - self.asked.get(index, -every) < every:
            return
        self.probing.add(index)
        self.asked[index] = self.awake

        def ask() -> None:
            try:
                if session.answers():
                    self.answer[index] = time.monotonic()
            finally:
                self.probing.discard(index)

        threading.Thread(target=ask, name=f"node{index}-keepalive", daemon=True).start()
