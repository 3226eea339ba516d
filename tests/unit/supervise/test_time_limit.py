"""`launch --time` over SSH (orchestrator/supervise/time_limit.py): when the warning goes out
and to whom, how the agents' answers and the ranks' exits are read, what status.json and
the summary say, and a supervisor driven through both endings: every rank ends on the
warning (failed, 124, no rank failed), or the ranks ignore it and the limit stops them."""

from __future__ import annotations

import math
import queue
import threading
import time
from pathlib import Path

import pytest

from orchestrator.agent.protocol import CommandReader
from orchestrator.api.launching import render
from orchestrator.api.request import LaunchArgs, build
from orchestrator.backends.sessions import Event
from orchestrator.errors import ConfigError
from orchestrator.plan.deadline import Deadline
from orchestrator.supervise import NodeState, Supervisor
from orchestrator.supervise.detect import Detector
from orchestrator.supervise.stopping import Stopper
from orchestrator.supervise.time_limit import WarningClock
from tests.factories import FakeSession, Notes, supervisor, world


class FakeRun:
    """What the clock reads of a supervisor."""

    def __init__(self, running: set[int], stopping: bool = False) -> None:
        nodes, ranks = world()
        self.ranks = {r.rank: r for r in ranks}
        self.sessions = [FakeSession(0), FakeSession(1)]
        self.running = running
        self.stopping = stopping
        self.stops: list[tuple[float, str]] = []

    def running_ranks(self) -> set[int]:
        return set(self.running)

    def begin_stop(self, grace: float, reason: str) -> None:
        self.stops.append((grace, reason))


def test_the_warning_goes_out_once_at_limit_minus_warning_to_the_nodes_whose_ranks_run() -> None:
    clock = WarningClock(40, ("USR1", 10), started_wall=1000.0)
    run, notes = FakeRun({0, 1}), Notes()
    assert clock.wait(1000.0) == 30 and clock.wait(1029.5) == 0.5
    assert not clock.tick(run, notes, 1029.9) and clock.sent_at is None
    assert not clock.tick(run, notes, 1030.0)
    assert run.sessions[0].sent == ["signal USR1"] and run.sessions[1].sent == []
    assert notes.notes == ["time limit in 10 s: SIGUSR1 to 2 rank(s) on 1 node(s)"]
    assert not clock.tick(run, notes, 1035.0)  # once
    assert run.sessions[0].sent == ["signal USR1"] and clock.wait(1035.0) == 5
    assert not clock.tick(run, notes, 1040.0) and run.stops == []  # the limit itself: not past
    assert clock.tick(run, notes, 1040.01) and clock.tick(run, notes, 1041)
    assert run.stops == [(0, "time limit of 40 s reached")]  # one stop, at once
    assert clock.at_limit == [0, 1] and clock.wait(1041) == math.inf


def test_no_warning_while_stopping_before_a_rank_runs_or_with_signal_none() -> None:
    clock = WarningClock(40, ("USR1", 10), started_wall=0.0)
    for run in (FakeRun({0}, stopping=True), FakeRun(set())):
        clock.tick(run, Notes(), 35.0)
        assert clock.sent_at is None and all(s.sent == [] for s in run.sessions)
    late = FakeRun({2, 3})  # ranks that start late still get it, what time is left
    clock.tick(late, Notes(), 38.4)
    assert late.sessions[1].sent == ["signal USR1"] and clock.before_limit_s == 2
    quiet = WarningClock(40, None, started_wall=0.0)
    run = FakeRun({0, 1, 2, 3})
    assert quiet.wait(0.0) == 40 and quiet.tick(run, Notes(), 41.0)
    assert all(s.sent == [] for s in run.sessions) and quiet.status() == {
        "time_limit_s": 40,
        "running_at_limit": [0, 1, 2, 3],
    }
    assert WarningClock(None, ("USR1", 10), 0.0).wait(1e9) == math.inf
    assert WarningClock(None, None, 0.0).status() == {}


def test_the_clock_of_a_deadline() -> None:
    clock = WarningClock.of(Deadline(40, "USR2", 10), started_wall=5.0)
    assert (clock.limit_s, clock.signal_name, clock.warning_s, clock.started_wall) == (
        40, "USR2", 10, 5.0,
    )  # fmt: skip
    assert WarningClock.of(Deadline(40), 0.0).signal_name is None
    assert WarningClock.of(Deadline(), 0.0).limit_s is None


def test_an_exit_counts_as_after_the_warning_by_the_nodes_own_clock() -> None:
    clock, notes = WarningClock(40, ("USR1", 10), 0.0), Notes()
    node_a, node_b = world()[0]
    clock.signalled_on(node_a, notes, "5000.250000", "0,1", "-")
    clock.signalled_on(node_b, notes, "9000.500000", "2", "3")
    assert notes.notes == [
        "b: 1 rank(s) do not catch SIGUSR1: not sent it (they run on to the limit)"
    ]
    assert clock.ranks_signalled == {0, 1, 2} and clock.not_catching == {3}
    assert clock.after(0, 5000.25) and clock.after(0, 5000.3) and not clock.after(0, 5000.2)
    assert not clock.after(0, 4999.0) and clock.after(0, 5000.0)  # bash < 5: whole seconds
    assert not clock.after(1, 5000.3) and clock.after(1, 9000.6)  # each node its own clock
    never = WarningClock(40, ("USR1", 10), 0.0)
    assert not never.after(0, 1e12)


def test_status_and_summaries() -> None:
    clock = WarningClock(40, ("USR1", 10), started_wall=100.0)
    run = FakeRun({0, 1, 2, 3})
    clock.tick(run, Notes(), 130.2)
    clock.signalled_on(NodeState(0, "a"), Notes(), "1.0", "0,1", "-")
    warning = clock.status()["warning"]
    assert warning["signal"] == "USR1" and warning["before_limit_s"] == 10
    assert warning["ranks_signalled"] == 2 and warning["ranks_not_catching_it"] == []
    assert warning["sent_at"].startswith("19")  # an ISO time
    ranks = {r.rank: r for r in world()[1]}
    assert clock.ended_summary(ranks, succeeded=False).startswith(
        "stopped on the time limit's warning (SIGUSR1 10 s before the 40 s limit): every "
        "rank exited after it; a program that saves a checkpoint on it resumes"
    )
    assert "every rank ended with exit code 0" in clock.ended_summary(ranks, succeeded=True)
    clock.not_catching = {1, 3}
    assert clock.ended_summary(ranks, succeeded=False).startswith(
        "stopped on the time limit's warning (SIGUSR1 10 s before the 40 s limit): 2 rank(s) "
        "exited after it, and the run was stopped: 2 do not catch it (rank 1 on a, rank 3 "
        "on b); "
    )
    clock.at_limit = [1, 3]
    assert clock.limit_summary(ranks) == (
        "the warning went out 10 s before it; still running at the limit (stopped then): "
        "rank 1 on a, rank 3 on b"
    )
    clock.at_limit = list(range(4)) + list(range(4, 20))
    assert clock.limit_summary(ranks).endswith("and 12 more")
    clock.at_limit = []
    assert clock.limit_summary(ranks).endswith("no rank was running at the limit")


def test_ended_on_it_needs_every_rank_done_and_no_other_stop() -> None:
    clock = WarningClock(40, ("USR1", 10), 0.0)
    nodes, ranks = world()
    for rank in ranks:
        rank.state = "stopped"
    assert not clock.ended_on_it(ranks, nodes, stopping=False)  # never sent
    clock.sent_at = 30.0
    assert not clock.ended_on_it(ranks, nodes, stopping=True)  # a stop of another cause
    clock.ended_run = True
    assert clock.ended_on_it(ranks, nodes, stopping=True)
    ranks[0].state = "succeeded"
    assert clock.ended_on_it(ranks, nodes, stopping=True)
    ranks[1].state = "killed"
    assert not clock.ended_on_it(ranks, nodes, stopping=True)
    ranks[1].state = "stopped"
    nodes[1].state = "lost"
    assert not clock.ended_on_it(ranks, nodes, stopping=True)
    nodes[1].state = "stopped"
    clock.at_limit = [2]
    assert not clock.ended_on_it(ranks, nodes, stopping=True)


def test_the_agent_reads_a_signal_command() -> None:
    reader = CommandReader()
    assert reader.feed(b"signal USR1\nsignal\nend 1,2\n") == [("signal", "USR1"), ("end", "1,2")]


# --- a supervisor driven through both endings -------------------------------------------


def supervise(tmp_path: Path, agents) -> tuple[Supervisor, object, list[FakeSession]]:
    """A supervisor of 2 nodes x 2 ranks with a limit of 1.5 s and SIGUSR1 1 s before it;
    `agents(sessions, events)` plays the nodes' agents in a thread."""
    sessions = [FakeSession(0), FakeSession(1)]
    events: queue.Queue[Event | None] = queue.Queue()
    clock = WarningClock(1.5, ("USR1", 1), started_wall=time.time())
    sup = supervisor(tmp_path, sessions=sessions, events=events, deadline=clock)
    now = time.time()
    for node in (0, 1):
        events.put(Event(node, "S", (str(100 + node), f"{now:.6f}")))
    helper = threading.Thread(target=agents, args=(sessions, events), daemon=True)
    helper.start()
    outcome = sup.run()
    helper.join(timeout=10)
    sup.sink.close()
    return sup, outcome, sessions


def wait_for_line(session: FakeSession, line: str) -> None:
    deadline = time.monotonic() + 5
    while not any(sent.startswith(line) for sent in session.sent):
        assert time.monotonic() < deadline, f"no {line!r} sent: {session.sent}"
        time.sleep(0.005)


def test_a_rank_that_ends_on_the_warning_stops_no_other_while_they_save(tmp_path: Path) -> None:
    """Rank 0 saves first and exits 138; the others were warned too and save more slowly:
    nothing is sent a stop (a SIGTERM would end a rank before its save), every rank ends
    by itself, and the run ends as one stopped on the warning."""

    def agents(sessions, events) -> None:
        for node in (0, 1):
            wait_for_line(sessions[node], "signal USR1")
        warned = time.time()
        for node in (0, 1):
            events.put(
                Event(node, "G", ("USR1", f"{warned:.6f}", f"{2 * node},{2 * node + 1}", "-"))
            )
        events.put(Event(0, "E", ("0", "138", f"{warned + 0.01:.6f}", "0")))  # saved first
        time.sleep(0.3)  # the others still save: nothing may stop them meanwhile
        events.put(Event(0, "E", ("1", "138", f"{warned + 0.3:.6f}", "0")))
        events.put(Event(1, "E", ("2", "138", f"{warned + 0.3:.6f}", "0")))
        events.put(Event(1, "E", ("3", "138", f"{warned + 0.31:.6f}", "0")))
        for node in (0, 1):
            events.put(Event(node, "X", ("1", f"{warned + 0.4:.6f}")))

    sup, outcome, sessions = supervise(tmp_path, agents)
    assert (outcome.state, outcome.exit_code) == ("failed", 124), outcome
    assert outcome.summary.startswith(
        "stopped on the time limit's warning (SIGUSR1 1 s before the 1.5 s limit): every rank "
        "exited after it"
    ), outcome.summary
    assert "failed first" not in outcome.summary and outcome.node_fault is None
    status = sup.status()
    assert [r["state"] for r in status["ranks"]] == ["stopped"] * 4
    assert status["stop_reason"] is None and not status["stopping"]
    assert status["warning"]["ranks_signalled"] == 4 and "running_at_limit" not in status
    for session in sessions:
        assert session.sent.count("signal USR1") == 1
        assert not any(line.startswith(("stop", "kill")) for line in session.sent), session.sent
    assert not sup.timed_out
    combined = (tmp_path / "combined.log").read_text()
    assert "time limit in 1 s: SIGUSR1 to 4 rank(s) on 2 node(s)" in combined
    assert "rank 0 on a ended with signal SIGUSR1 (exit code 138) after the time limit's" in (
        combined
    )
    assert "failed with" not in combined and "stopping the run" not in combined


def test_once_only_ranks_that_do_not_catch_the_warning_are_left_the_run_stops(
    tmp_path: Path,
) -> None:
    """Node b's ranks do not catch SIGUSR1 (its agent did not send it): when node a's
    ranks have both saved and ended, the run stops b's at once instead of waiting for
    the limit; the summary names them."""

    def agents(sessions, events) -> None:
        for node in (0, 1):
            wait_for_line(sessions[node], "signal USR1")
        warned = time.time()
        events.put(Event(0, "G", ("USR1", f"{warned:.6f}", "0,1", "-")))
        events.put(Event(1, "G", ("USR1", f"{warned:.6f}", "-", "2,3")))
        events.put(Event(0, "E", ("0", "138", f"{warned + 0.01:.6f}", "0")))
        time.sleep(0.2)
        assert not any(line.startswith("stop") for line in sessions[1].sent), sessions[1].sent
        events.put(Event(0, "E", ("1", "138", f"{warned + 0.2:.6f}", "0")))
        for node in (0, 1):
            wait_for_line(sessions[node], "stop")
        events.put(Event(1, "E", ("2", "143", f"{time.time():.6f}", "1")))
        events.put(Event(1, "E", ("3", "143", f"{time.time():.6f}", "1")))
        for node in (0, 1):
            events.put(Event(node, "X", ("1", f"{time.time():.6f}")))

    sup, outcome, _ = supervise(tmp_path, agents)
    assert (outcome.state, outcome.exit_code) == ("failed", 124), outcome
    assert "2 rank(s) exited after it, and the run was stopped: 2 do not catch it" in (
        outcome.summary
    ), outcome.summary
    assert sup.status()["stop_reason"] == "rank 1 on a ended on the time limit's warning"
    combined = (tmp_path / "combined.log").read_text()
    assert "the 2 rank(s) left do not catch the warning; stopping the run on every node" in (
        combined
    )


def test_ranks_that_ignore_the_warning_are_stopped_at_the_limit_and_named(tmp_path: Path) -> None:
    def agents(sessions, events) -> None:
        wait_for_line(sessions[0], "signal USR1")
        warned = time.time()
        events.put(Event(0, "G", ("USR1", f"{warned:.6f}", "-", "0,1")))
        events.put(Event(1, "G", ("USR1", f"{warned:.6f}", "-", "2,3")))
        for node in (0, 1):
            wait_for_line(sessions[node], "kill")
        for rank in range(4):  # SIGKILL: after the stop, though also after the warning
            events.put(Event(rank // 2, "E", (str(rank), "-9", f"{time.time():.6f}", "1")))
        for node in (0, 1):
            events.put(Event(node, "X", ("-9", f"{time.time():.6f}")))

    sup, outcome, _ = supervise(tmp_path, agents)
    assert (outcome.state, outcome.exit_code) == ("failed", 124), outcome
    assert outcome.summary == (
        "stopped: time limit of 1.5 s reached; the warning went out 1 s before it; still "
        "running at the limit (stopped then): rank 0 on a, rank 1 on a, rank 2 on b, rank 3 on b"
    )
    status = sup.status()
    assert status["running_at_limit"] == [0, 1, 2, 3] and sup.timed_out
    assert status["warning"]["ranks_not_catching_it"] == [0, 1, 2, 3]
    combined = (tmp_path / "combined.log").read_text()
    assert "2 rank(s) do not catch SIGUSR1: not sent it (they run on to the limit)" in combined


def test_a_rank_that_failed_before_the_warning_is_still_the_first_failure() -> None:
    nodes, ranks = world()
    notes = Notes()
    stopper = Stopper(nodes, [FakeSession(0), FakeSession(1)], notes, 3)
    det = Detector(nodes, ranks, notes, stopper)
    det.warning = WarningClock(40, ("USR1", 10), det.started_wall)
    t0 = det.started_wall
    assert det.rank_exited(1, 3, t0 + 1) == "rank 1 on a failed"  # before any warning
    stopper.begin(3, "rank 1 on a failed")
    det.warning.sent_at = t0 + 2  # (a warning can only go out while nothing stops: shown anyway)
    for rank in (0, 2, 3):
        assert det.rank_exited(rank, 138, t0 + 3, after_stop=True, warned=True) is None
    for node in nodes:
        det.node_exited(node, 1, t0 + 4)
    outcome = det.outcome()
    assert (outcome.state, outcome.exit_code) == ("failed", 3)
    assert "rank 1 (local rank 1) on a ended with exit code 3" in outcome.summary


# --- the flags -------------------------------------------------------------------------


def hostfile(tmp_path: Path) -> str:
    path = tmp_path / "hosts.txt"
    path.write_text("localhost slots=2\n")
    (tmp_path / "job.py").write_text("print('hi')\n")
    return str(path)


def build_ssh(tmp_path: Path, **keywords):
    args = LaunchArgs.of({"run_dir": str(tmp_path / "runs"), **keywords})
    return build(hostfile(tmp_path), [str(tmp_path / "job.py")], args, ("orchestrator",), print)


def test_time_and_signal_make_the_deadline_of_an_ssh_launch(tmp_path: Path) -> None:
    assert build_ssh(tmp_path).options.deadline == Deadline()
    assert build_ssh(tmp_path, time="0:40").options.deadline == Deadline(40, "USR1", 10)
    assert build_ssh(tmp_path, time="4:00:00", signal="USR2@300").options.deadline == (
        Deadline(14400, "USR2", 300)
    )
    assert build_ssh(tmp_path, time="10", signal="none").options.deadline == Deadline(600)
    request = build_ssh(tmp_path, backend="local", time="1")
    assert request.options.deadline.limit_s == 60 and request.slurm.time == "1"


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"time": "soon"}, "--time 'soon': expected a time limit"),
        ({"time": "1", "signal": "USR1@60"}, "the warning would come before the run starts"),
        ({"time": "1", "signal": "TERM@10"}, "--signal 'TERM@10': expected USR1@SECONDS"),
        ({"signal": "USR1@60"}, "--signal USR1@60 without --time: over SSH"),
        ({"time": "1", "max_resubmits": 3}, "--max-resubmits applies to --backend slurm only"),
        ({"time": "1", "requeue": True}, "--requeue applies to --backend slurm only"),
    ],
)
def test_bad_deadlines_and_slurm_only_flags_are_refused(tmp_path: Path, keywords, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        build_ssh(tmp_path, **keywords)
    assert info.value.exit_code == 2


def test_render_over_ssh_refuses_a_time_limit_it_cannot_keep(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--time over SSH is kept by launch's controller"):
        render(hostfile(tmp_path), [str(tmp_path / "job.py")], out_dir=tmp_path / "out", time="5")
