"""`--backend slurm --min-nodes K` growing back, without a cluster: which lost nodes may
join (idle again, never more than launched), the larger job's shape, when SLURM is asked,
the warning to the ranks through their agents, and the next job with `attempts` and
`world`. The end-to-end test on the lab's SLURM is
tests/cluster/test_slurm_min_nodes_cluster.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.options.supervision import Supervision
from orchestrator.record.plain import from_plain, to_plain
from orchestrator.slurm.batch.job import SlurmJob
from orchestrator.slurm.batch.planning import plan_slurm_job
from orchestrator.slurm.control.parse import JobInfo
from orchestrator.slurm.recovery.grow_back import (
    SlurmRegrow,
    coming_back,
    grown,
    idle_nodes,
    lost_nodes,
)
from orchestrator.slurm.recovery.job_attempts import JobAttempts
from orchestrator.slurm.recovery.resubmit import EndedJob, Resubmitting, next_job
from orchestrator.slurm.recovery.shrink import shrunk
from orchestrator.supervise import NodeState, RankState
from orchestrator.supervise.time_limit import WarningClock
from tests.factories import FakeSession, Notes
from tests.unit.slurm.test_slurm_min_nodes import _job
from tests.unit.slurm.test_slurm_render import spec
from tests.unit.slurm.test_slurm_spares import FakeCommands


@pytest.mark.parametrize(
    ("nnodes", "lost", "idle", "expected"),
    [
        (2, ["c1"], ["c1"], ["c1"]),  # back: the job grows to the 3 launched
        (2, ["c1"], [], []),  # still down (sinfo: down*, drained, ...)
        (1, ["c1", "c2"], ["c2"], ["c2"]),  # the one of two that is back
        (1, ["c1", "c2"], ["c2", "c1"], ["c1", "c2"]),  # both, in the order lost
        (3, ["c1"], ["c1"], []),  # already on as many as launched (a spare took its place)
    ],
)
def test_which_lost_nodes_join(
    nnodes: int, lost: list[str], idle: list[str], expected: list[str]
) -> None:
    job = _job().on_nodes(nnodes, (), tuple(lost))
    assert coming_back(job, lost, idle) == expected


def test_never_more_than_launched() -> None:
    job = _job().on_nodes(2, (), ("c1", "c2"))  # 2 of 3 (a spare took one's place)
    assert coming_back(job, ["c1", "c2"], ["c1", "c2"]) == ["c1"]


def test_only_the_nodes_lost_since_launch_are_asked() -> None:
    job = plan_slurm_job(spec("t.py"), SlurmOptions(nodes=3), "r", exclude=("c9",), min_nodes=2)
    assert job.launch_exclude == ("c9",)  # excluded at launch (--exclude, bad-node list)
    smaller = shrunk(job, ["c1"], None)
    assert lost_nodes(smaller) == ["c1"]
    assert lost_nodes(job) == []
    # The job keeps what the launch excluded: read back as an attached follower reads it
    # (follower.json), it still asks for c1 alone.
    again = from_plain(SlurmJob, json.loads(json.dumps(to_plain(smaller))))
    assert lost_nodes(again) == ["c1"]


def test_the_larger_job_takes_the_node_back_with_the_same_environment() -> None:
    job = _job().on_nodes(3, (), ("c9",))
    smaller = shrunk(job, ["c1"], "/r/nodes-2")
    new = grown(smaller, ["c1"], "/r/nodes-3")
    assert (new.nnodes, new.world_size, new.exclude, new.job_dir) == (3, 6, ("c9",), "/r/nodes-3")
    assert "--nodes=3" in new.sbatch_lines and "--exclude=c9" in new.sbatch_lines
    assert new.env == job.env and dict(new.env)["ORCHESTRATOR_LAUNCH_WORLD_SIZE"] == "6"
    plain = grown(shrunk(_job(), ["c1"], None), ["c1"], None)
    assert not any(line.startswith("--exclude") for line in plain.sbatch_lines)


def test_with_a_hostfile_the_node_goes_back_into_the_node_list() -> None:
    cluster = parse_hostfile("n1\nn2\nn3\n", "hosts")
    job = plan_slurm_job(spec("t.py"), SlurmOptions(), "r", cluster, min_nodes=2)
    new = grown(shrunk(job, ["n2"], None), ["n2"], None)
    assert (new.nnodes, new.nodelist) == (3, ("n1", "n3", "n2"))
    assert "--nodelist=n1,n3,n2" in new.sbatch_lines and "--nodes=3" in new.sbatch_lines


def test_idle_means_sinfo_says_idle_and_nothing_else() -> None:
    out = "c1|idle\nc2|down*\nc3|idle*\nc4|drained\nc5|allocated\n"
    commands = FakeCommands(sinfo=(0, out))
    names = ["c1", "c2", "c3", "c4", "c5"]
    assert idle_nodes(commands, names) == ["c1"]  # type: ignore[arg-type]
    assert commands.calls == [["sinfo", "-h", "-N", "-n", "c1,c2,c3,c4,c5", "-o", "%N|%T"]]
    assert idle_nodes(FakeCommands(sinfo=(1, "")), names) == []  # type: ignore[arg-type]
    assert idle_nodes(FakeCommands(), []) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(("heartbeat", "every"), [(0, 30.0), (5, 10.0), (60, 30.0)])
def test_slurm_is_asked_as_often_as_nodes_over_ssh(heartbeat: float, every: float) -> None:
    regrow = SlurmRegrow(FakeCommands(), Supervision(heartbeat_timeout=heartbeat))  # type: ignore[arg-type]
    assert regrow.every == every


class Attempt:
    """The supervisor of the attempt on 2 nodes: what the warning clock reads of it."""

    def __init__(self, hosts: list[str], running: bool = True) -> None:
        self.sessions = [FakeSession(k) for k in range(len(hosts))]
        self.ranks = {r: RankState(r, r // 2, r % 2, hosts[r // 2]) for r in range(2 * len(hosts))}
        self.running, self.stopping = running, False
        self.sink, self.deadline = Notes(), WarningClock(None, None, time.time())
        self.swap_due = None  # no slow node to take out

    def running_ranks(self) -> set[int]:
        return set(self.ranks) if self.running else set()

    def begin_stop(self, grace: float, reason: str) -> None:
        raise AssertionError("a checkpoint is no stop")


class Follower:
    """What of the follower growing back and next_job read."""

    def __init__(self, job: SlurmJob, attempts: JobAttempts) -> None:
        self.job, self.job_id, self.info, self.hosts = job, 11, JobInfo(state="RUNNING"), []
        self.sup: Attempt | None = None
        self.attempts, self.spares, self.first_job_dir = attempts, None, "/r/nodes"
        self.base, self.notes, self.jobs, self.statuses = {}, [], [], 0
        self.batch = None
        self.regrow: SlurmRegrow | None = None

    def submit(self, job: SlurmJob, number: int) -> int:
        self.jobs.append((job, number))
        return 300 + number

    def note(self, text: str) -> None:
        self.notes.append(text)

    def write_status(self) -> None:
        self.statuses += 1

    def ended(self) -> EndedJob:
        sup = self.sup
        return EndedJob(self.job, self.job_id, self.info, self.hosts, sup, Path("slurm.out"))  # type: ignore[arg-type]

    def resubmitting(self) -> Resubmitting:
        means = (self.attempts, self.submit, self.first_job_dir, self.note, self.base.update)
        return Resubmitting(*means, self.spares, self.regrow)


def _on_two_of_three() -> tuple[Follower, SlurmJob, JobAttempts]:
    """A run of 3 nodes that lost c1 and runs job 12 on c0 and c2."""
    launched = _job()
    attempts = JobAttempts(11, max_resubmits=0, nodes=3)
    attempts.running(["c0", "c1", "c2"], 6)
    attempts.ended("NODE_FAIL", ranks_ok=False)
    smaller = shrunk(launched, ["c1"], "/r/nodes-2")
    attempts.resubmitted(12, "SLURM job 11 ended NODE_FAIL: c1 is down", 2)
    attempts.running(["c0", "c2"], 4)
    f = Follower(smaller, attempts)
    f.job_id = 12
    return f, launched, attempts


def test_a_lost_node_back_grows_the_run_at_the_next_checkpoint() -> None:
    f, launched, attempts = _on_two_of_three()
    commands = FakeCommands(sinfo=(0, "c1|down*\n"))
    regrow = f.regrow = SlurmRegrow(commands, Supervision(heartbeat_timeout=5))  # type: ignore[arg-type]
    sup = f.sup = Attempt(["c0", "c2"])

    regrow.check(f)  # type: ignore[arg-type]
    assert commands.calls == []  # not before 2 x --heartbeat-timeout
    regrow.asked_at -= 10
    regrow.check(f)  # type: ignore[arg-type]
    assert len(commands.calls) == 1 and f.notes == []  # still down
    assert all(s.sent == [] for s in sup.sessions)

    commands.answers["sinfo"] = (0, "c1|idle\n")
    regrow.check(f)  # type: ignore[arg-type]
    assert len(commands.calls) == 1  # asked again only after the interval
    regrow.asked_at -= 10
    regrow.check(f)  # type: ignore[arg-type]
    assert f.notes == ["c1 back; growing to 3 nodes at the next checkpoint"]
    assert [s.sent for s in sup.sessions] == [["signal USR1"], ["signal USR1"]]
    assert sup.sink.notes == ["growing to 3 nodes: SIGUSR1 to 4 rank(s) on 2 node(s)"]
    assert attempts.current.warned_at is not None
    assert attempts.current.warning == "SIGUSR1 to grow to 3 nodes"
    regrow.check(f)  # type: ignore[arg-type]
    assert [s.sent for s in sup.sessions] == [["signal USR1"], ["signal USR1"]]  # once

    # The ranks saved and exited 138: the script's exit ends the job FAILED.
    f.info = JobInfo(state="FAILED")
    attempts.ended("FAILED", ranks_ok=False)
    new = next_job(f.ended(), f.resubmitting(), 3)
    assert new is not None and new[1] == 303
    [(job, number)] = f.jobs
    assert (job.nnodes, job.exclude, job.job_dir, number) == (3, (), "/r/nodes-3", 3)
    assert "--nodes=3" in job.sbatch_lines
    assert f.notes[1:] == [
        "attempt 3: SLURM job 303 submitted, after job 12 stopped at a checkpoint to grow "
        "to 3 nodes (c1 back)",
        "run r: SLURM job 303 submitted (attempt 3) on 3 node(s), with c1 again",
    ]
    attempts.running(["c0", "c1", "c2"], 6)
    entries = attempts.status()["attempts"]
    assert [(s["job_id"], s["nodes"], s["ended"], s["next"]) for s in entries] == [
        (11, 3, "node-failure", "resubmitted as job 12 on 2 node(s)"),
        (12, 2, "grow", "resubmitted as job 303 on 3 node(s)"),
        (303, 3, None, None),
    ]
    world = attempts.status()["world"]
    assert [len(w["nodes"]) for w in world] == [3, 2, 3]
    assert world[2]["why"] == ("after job 12: stopped at a checkpoint to grow to 3 nodes (c1 back)")
    assert attempts.left == 0  # a growth uses no --max-resubmits

    # On as many as launched: SLURM is not asked again.
    f.job, f.sup = job, Attempt(["c0", "c1", "c2"])
    regrow.asked_at -= 100
    regrow.check(f)  # type: ignore[arg-type]
    assert len(commands.calls) == 2


def test_no_rank_running_yet_the_warning_waits_and_a_job_that_completed_is_not_grown() -> None:
    f, launched, attempts = _on_two_of_three()
    regrow = f.regrow = SlurmRegrow(FakeCommands(sinfo=(0, "c1|idle\n")), None)  # type: ignore[arg-type]
    sup = f.sup = Attempt(["c0", "c2"], running=False)
    regrow.asked_at -= 60
    regrow.check(f)  # type: ignore[arg-type]
    assert f.notes == ["c1 back; growing to 3 nodes at the next checkpoint"]
    assert attempts.current.warned_at is None and sup.sessions[0].sent == []
    sup.running = True
    regrow.check(f)  # type: ignore[arg-type]
    assert sup.sessions[0].sent == ["signal USR1"] and len(f.notes) == 1

    # The ranks finished before the signal reached them: the run ends as it is.
    attempts.ended("COMPLETED", ranks_ok=True)
    assert next_job(f.ended(), f.resubmitting(), 3) is None
    assert f.jobs == [] and regrow.back == []


def test_a_time_limits_warning_first_is_left_to_the_time_limit() -> None:
    f, launched, attempts = _on_two_of_three()
    commands = FakeCommands(sinfo=(0, "c1|idle\n"))
    regrow = f.regrow = SlurmRegrow(commands, None)  # type: ignore[arg-type]
    f.sup = Attempt(["c0", "c2"])
    attempts.current.warned_at = time.time()  # the script's warning file
    regrow.asked_at -= 60
    regrow.check(f)  # type: ignore[arg-type]
    assert commands.calls == [] and f.notes == []


def test_ranks_that_do_not_catch_the_signal_yet_are_sent_it_again() -> None:
    """A program still starting (torch's import) has no handler yet: the agents skip its
    ranks (G ... - 0,1), and the warning goes out again after the interval."""
    f, launched, attempts = _on_two_of_three()
    regrow = f.regrow = SlurmRegrow(FakeCommands(sinfo=(0, "c1|idle\n")), None)  # type: ignore[arg-type]
    sup = f.sup = Attempt(["c0", "c2"])
    regrow.asked_at -= 60
    regrow.check(f)  # type: ignore[arg-type]
    assert sup.sessions[0].sent == ["signal USR1"]
    for index, host in enumerate(["c0", "c2"]):  # each node's answer: none caught it
        node = NodeState(index=index, host=host, ranks=(index,))
        sup.deadline.signalled_on(node, sup.sink, "1.0", "-", str(index))
    regrow.check(f)  # type: ignore[arg-type]
    assert sup.sessions[0].sent == ["signal USR1"]  # not before the interval
    regrow.sent_at -= 60
    regrow.check(f)  # type: ignore[arg-type]  # forgets the first
    regrow.check(f)  # type: ignore[arg-type]  # and sends it again
    assert sup.sessions[0].sent == ["signal USR1", "signal USR1"]
    assert attempts.current.warned_at is not None and regrow.signalled
    assert f.notes == ["c1 back; growing to 3 nodes at the next checkpoint"]  # said once
