"""What the SLURM follower does with its node agents' frames
(orchestrator.slurm.following.node_agents): the ranks' lines go to the log as over SSH, a rank's or
node's end and the time limit's signal to the follower's own judgement, a closed channel is told and
dialled again only while the job runs, and each frame handled moves the node's read point."""

from __future__ import annotations

import queue
import time
from pathlib import Path

from orchestrator.agent.protocol import Frame
from orchestrator.backends.sessions import CHANNEL_CLOSED, Event
from orchestrator.options.supervision import Supervision
from orchestrator.record.runs import RunRecord
from orchestrator.slurm.following.handover import Bookmarks
from orchestrator.slurm.following.node_agents import NodeAgents
from orchestrator.supervise import Supervisor
from tests.factories import FakeSession, hear_agents, supervisor


class Judge:
    def __init__(self) -> None:
        self.said: list[tuple] = []

    def rank_exited(self, rank, code, when, after_stop=None) -> None:
        self.said.append(("rank", rank, code, after_stop))

    def node_exited(self, node, code, when) -> None:
        self.said.append(("node", node.index, code))

    def warned(self, signal_name, when) -> None:
        self.said.append(("warned", signal_name, when))

    def channel_closed(self, node) -> None:
        self.said.append(("closed", node))


class Channel:
    """What is read of a session's channel: where its stream began, whether the keeper
    answered."""

    start = 1000
    connected = True


def agents_of(tmp_path: Path) -> tuple[NodeAgents, Supervisor, queue.Queue]:
    events: queue.Queue = queue.Queue()
    record = RunRecord.create(tmp_path, "r1")
    agents = NodeAgents(7, 0, "python3", Bookmarks(record, None), events)
    agents.sessions.append(FakeSession(0, Channel()))  # type: ignore[arg-type]
    supervision = Supervision(hang_timeout=0)
    sup = supervisor(
        tmp_path / "logs",
        ("n0",),
        1,
        sessions=agents.sessions,
        events=events,
        label="{host} r{rank}",
        supervision=supervision,
    )
    return agents, sup, events


def test_lines_go_to_the_log_and_ends_to_the_judge_in_stream_order(tmp_path: Path) -> None:
    agents, sup, events = agents_of(tmp_path)
    judge, later = Judge(), time.time() + 100  # node times after the run began
    events.put(Event(0, Frame.RANK_OUTPUT, ("0",), b"step 1\n", 1.0, end=20))
    events.put(None)  # a wake-up between frames
    events.put(Event(0, Frame.TIME_WARNING, ("USR1", f"{later}", "-", "-"), b"", 2.0, 40))
    events.put(Event(0, Frame.RANK_EXITED, ("0", "138", f"{later + 1}", "0"), b"", 3.0, 60))
    events.put(Event(0, Frame.FINISHED, ("138", f"{later + 2}"), b"", 4.0, end=80))
    came = hear_agents(agents, sup, judge, running=True)
    sup.sink.flush()
    assert came == 4
    assert (tmp_path / "logs" / "rank-0.log").read_bytes() == b"step 1\n"
    assert judge.said == [
        ("warned", "USR1", later),
        ("rank", 0, 138, False),
        ("node", 0, 138),
    ]
    assert agents.bookmarks.agents == {"0": 1080}  # the channel's start + the last frame's end


def test_a_closed_channel_is_dialled_again_only_while_the_job_runs(tmp_path: Path) -> None:
    agents, sup, events = agents_of(tmp_path)
    judge = Judge()
    events.put(Event(0, CHANNEL_CLOSED, (), b"srun: error: ...\n"))
    hear_agents(agents, sup, judge, running=False)
    assert judge.said == [("closed", 0)] and agents.redial_at == {}
    sup.nodes[0].done = True
    events.put(Event(0, CHANNEL_CLOSED, (), b""))
    hear_agents(agents, sup, judge, running=True)
    assert agents.redial_at == {}  # its node ended: nothing more to hear


def test_a_node_that_cannot_reach_the_store_ends_the_job_unreachable(tmp_path: Path) -> None:
    """U goes to the handlers as over SSH; the job SLURM then ends cancelled is `unreachable`."""
    from orchestrator.record.states import RunState
    from orchestrator.slurm.control.parse import JobInfo
    from orchestrator.slurm.recovery.outcome import job_outcome

    agents, sup, events = agents_of(tmp_path)
    now = f"{time.time() + 1:.6f}"
    events.put(Event(0, Frame.STARTED, ("4242", now, "eth0=10.0.0.1"), b"", 1.0, end=20))
    fields = ("10.0.0.9", "29500", "6", "store", "torchrun")
    events.put(Event(0, Frame.NO_ANSWER, fields, b"", 2.0, end=40))
    assert hear_agents(agents, sup, Judge(), running=True) == 2
    assert sup.nodes[0].addresses == ("10.0.0.1",) and sup.stopping
    assert agents.sessions[0].sent == [f"stop {sup.supervision.grace:g}"]  # to the agent
    outcome = job_outcome(7, JobInfo("CANCELLED", exit_code=15), sup, None, tmp_path / "out")
    assert (outcome.state, outcome.exit_code) == (RunState.UNREACHABLE, 1)
    assert "n0 cannot reach the store on n0 at 10.0.0.9:29500" in outcome.summary
