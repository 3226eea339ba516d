"""Supervision's parts without a cluster: stopping (what each node is told, signals),
failure detection (who failed first, lost nodes, outcomes) and the loop that joins them.
The agent sessions are fakes: the end-to-end behaviour is in test_supervision_cluster.py."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from pathlib import Path

from orchestrator.backends.sessions import Event
from orchestrator.options.supervision import Supervision
from orchestrator.supervise import describe_exit
from orchestrator.supervise.detect import Detector
from orchestrator.supervise.frame_handlers import handle
from orchestrator.supervise.state import Outcome
from orchestrator.supervise.stopping import STOP_MARGIN_S, Stopper, signals_to
from orchestrator.supervise.supervisor import IDLE_TICK_S
from tests.factories import FakeSession, Notes, supervisor, world

# --- stopping -------------------------------------------------------------------------


def test_stop_goes_to_running_nodes_once_and_only_shortens() -> None:
    nodes, _ = world()
    sessions = [FakeSession(0), FakeSession(1)]
    nodes[1].done = True
    first: list[int] = []
    stopper = Stopper(nodes, sessions, Notes(), grace=5, on_first_stop=lambda: first.append(1))
    stopper.begin(5, "rank 1 failed")
    stopper.begin(0, "SIGINT twice")
    assert sessions[0].sent == ["stop 5", "kill"]
    assert sessions[1].sent == []  # that node had ended already
    assert stopper.reason == "rank 1 failed" and first == [1]
    assert not stopper.overdue(time.monotonic())
    assert stopper.overdue(time.monotonic() + STOP_MARGIN_S + 1)


def test_first_signal_stops_with_grace_second_kills() -> None:
    nodes, _ = world()
    session, notes = FakeSession(0), Notes()
    stopper = Stopper(nodes, [session], notes, grace=7)
    stopper.interrupt(signal.SIGINT)
    stopper.handle_signals()
    stopper.interrupt(signal.SIGTERM)
    stopper.handle_signals()
    assert session.sent == ["stop 7", "kill"]
    assert stopper.interrupted_by == signal.SIGINT  # the first one decides the exit code
    assert "SIGINT: stopping the run on every node" in notes.notes[0]
    assert "SIGTERM again: killing" in notes.notes[1]


def test_exits_after_the_stop_began_are_its_doing() -> None:
    nodes, _ = world()
    stopper = Stopper(nodes, [], Notes(), grace=1)
    assert not stopper.caused(time.time())
    stopper.begin(1, "test")
    assert stopper.wall is not None
    assert stopper.caused(stopper.wall + 0.5) and not stopper.caused(stopper.wall - 0.5)


# --- detection ------------------------------------------------------------------------


def detector(stop_on_failure: bool = True) -> tuple[Detector, Stopper, Notes]:
    nodes, ranks = world()
    notes = Notes()
    stopper = Stopper(nodes, [], notes, grace=1)
    return Detector(nodes, ranks, notes, stopper, stop_on_failure=stop_on_failure), stopper, notes


def test_first_failure_is_by_exit_time_not_report_order() -> None:
    det, stopper, _ = detector()
    now = time.time()
    assert det.rank_exited(3, 1, now - 1) == "rank 3 on b failed"
    stopper.begin(1, "rank 3 on b failed")
    # Reported later, but it ended earlier, before the stop: a failure, and the first.
    assert det.rank_exited(1, 2, now - 2) is None
    assert det.ranks[1].state == "failed"
    first = det.faults()[0]  # the verdict's first fault
    assert first.kind == "rank" and first.subject.rank == 1
    outcome = det.outcome()
    assert (outcome.state, outcome.exit_code) == ("failed", 2)
    assert "rank 1 (local rank 1) on a ended with exit code 2" in outcome.summary
    assert "line of rank 1" in outcome.summary


def test_ranks_ending_after_the_stop_were_stopped_and_unreported_ones_killed() -> None:
    det, stopper, _ = detector()
    stopper.begin(1, "SIGINT to the orchestrator")
    det.rank_exited(0, 143, time.time() + 1)
    assert det.ranks[0].state == "stopped"
    assert det.node_exited(det.nodes[0], 143, time.time()) is None
    assert det.ranks[1].state == "killed" and det.nodes[0].state == "stopped"


def test_node_script_failing_before_any_rank_is_the_cause() -> None:
    det, _, notes = detector()
    assert det.node_exited(det.nodes[1], 127, time.time()) == "b failed"
    assert det.ranks[2].state == "unknown"
    outcome = det.outcome()
    assert (outcome.state, outcome.exit_code) == ("failed", 127)
    assert "node script on b ended with exit code 127 before any rank failed" in outcome.summary
    assert "node script ended with exit code 127" in notes.notes[0]


def test_a_lost_node_is_the_outcome_and_stays_lost_whatever_it_reports_later() -> None:
    det, _, _ = detector()
    assert det.node_lost(det.nodes[0], "no word from its agent for 31 s") == "a lost"
    # The node was only slow: its agent reports its ranks and its end after all.
    det.rank_exited(0, 0, time.time(), after_stop=True)
    det.rank_exited(1, 0, time.time(), after_stop=True)
    det.node_exited(det.nodes[0], 0, time.time())
    det.rank_exited(2, 143, time.time(), after_stop=True)
    det.node_exited(det.nodes[1], 143, time.time())
    assert det.nodes[0].state == "lost" and det.ranks[0].state == "unknown"
    outcome = det.outcome()
    assert (outcome.state, outcome.exit_code) == ("lost", 1)
    assert "node a was lost: no word" in outcome.summary


def test_a_rank_that_ended_after_its_node_got_the_stop_was_stopped_whatever_the_times() -> None:
    """A node whose clock is behind reports its stopped rank as ending before the failure:
    its agent's word (after the stop, in its own clock) decides, not the times."""
    det, stopper, _ = detector()
    failed_at = time.time()
    assert det.rank_exited(0, 3, failed_at) == "rank 0 on a failed"
    stopper.begin(1, "rank 0 on a failed")
    det.rank_exited(2, 143, failed_at - 0.05, after_stop=True)
    assert det.ranks[2].state == "stopped"
    outcome = det.outcome()
    assert (outcome.state, outcome.exit_code) == ("failed", 3)
    assert "rank 0 (local rank 0) on a ended with exit code 3" in outcome.summary


def test_a_node_gone_silent_before_a_rank_failed_is_the_first_failure() -> None:
    """Power lost on node b: the ranks on a fail at once (their peer vanished), b is found
    lost only after the stop; b fell silent first, so b is what failed."""
    det, stopper, _ = detector()
    det.nodes[1].heard_wall = time.time() - 0.5
    assert det.rank_exited(0, 1, time.time()) == "rank 0 on a failed"
    stopper.begin(1, "rank 0 on a failed")
    det.node_lost(det.nodes[1], "its agent did not report back after the stop", gone=True)
    outcome = det.outcome()
    assert (outcome.state, outcome.exit_code) == ("lost", 1)
    assert outcome.summary.startswith("job failed: node b was lost")


def test_a_node_lost_during_the_stop_after_a_failure_does_not_take_the_blame() -> None:
    det, stopper, _ = detector()
    assert det.rank_exited(0, 3, time.time() - 1) == "rank 0 on a failed"
    stopper.begin(1, "rank 0 on a failed")
    det.nodes[1].heard_wall = time.time()  # heard after the failure: alive then
    det.node_lost(det.nodes[1], "its agent did not report back after the stop", gone=True)
    outcome = det.outcome()
    assert (outcome.state, outcome.exit_code) == ("failed", 3)


def test_killed_ranks_never_make_a_success() -> None:
    """The node scripts ended with 0, but a rank never said how it ended."""
    det, _, _ = detector()
    for rank in (0, 1, 2):
        det.rank_exited(rank, 0, time.time())
    det.node_exited(det.nodes[0], 0, time.time())
    det.node_exited(det.nodes[1], 0, time.time())
    assert det.ranks[3].state == "unknown"
    outcome = det.outcome()
    assert (outcome.state, outcome.exit_code) == ("failed", 1)
    assert "rank 3 on b: unknown" in outcome.summary


def test_a_full_disk_explains_the_failures_on_its_node() -> None:
    """The rank on b failed because it could not write: its agent says so (W) before the
    rank's exit, which happened earlier; the run failed because of b's disk, exit 1."""
    det, stopper, notes = detector()
    failed_at = time.time()
    what = "no space left on device in ~/.orchestrator/runs/r1/node1"
    assert det.node_disk(det.nodes[1], what, failed_at + 0.2) == f"b: {what}"
    stopper.begin(1, f"b: {what}")
    assert det.rank_exited(2, 1, failed_at) is None  # before the stop: failed, by the disk
    det.rank_exited(0, 143, failed_at + 0.3, after_stop=True)
    det.node_exited(det.nodes[1], 1, failed_at + 0.4)
    faults = det.faults()
    assert [(f.kind, f.when) for f in faults] == [("disk", failed_at)]
    outcome = det.outcome()
    assert (outcome.state, outcome.exit_code) == ("failed", 1)
    assert outcome.summary.startswith(f"job failed: b: {what}")
    assert f"b: {what}; stopping the run on every node" in notes.notes
    assert det.nodes[1].detail == what


def test_a_disk_fault_found_during_the_stop_is_not_the_cause() -> None:
    det, stopper, notes = detector()
    assert det.rank_exited(0, 3, time.time() - 1) == "rank 0 on a failed"
    stopper.begin(1, "rank 0 on a failed")
    assert det.node_disk(det.nodes[1], "disk quota exceeded in ~/x", time.time()) is None
    outcome = det.outcome()
    assert (outcome.state, outcome.exit_code) == ("failed", 3)
    assert "b: disk quota exceeded in ~/x" in notes.notes


def test_a_rank_on_another_node_that_failed_earlier_stays_first() -> None:
    det, stopper, _ = detector()
    now = time.time()
    det.rank_exited(0, 3, now - 5)
    stopper.begin(1, "rank 0 on a failed")
    det.nodes[1].disk_at = now  # found before the stop, but after rank 0 failed
    det.nodes[1].disk = "no space left on device in ~/x"
    assert [f.kind for f in det.faults()] == ["rank", "disk"]
    assert det.outcome().exit_code == 3


def test_without_stop_on_failure_nothing_asks_to_stop() -> None:
    det, _, _ = detector(stop_on_failure=False)
    assert det.rank_exited(0, 1, time.time()) is None
    assert det.node_exited(det.nodes[0], 1, time.time()) is None


def test_a_hang_asks_to_stop_with_or_without_stop_on_failure() -> None:
    """srun ends a SLURM step on a failed task, never on a hung one: that stop is ours."""
    for stop_on_failure in (True, False):
        det, _, _ = detector(stop_on_failure=stop_on_failure)
        assert det.hung("job hung: ...") == "the run hangs: no rank moved"
        assert det.hung("job hung: ...") is None  # once


def test_describe_exit_names_signals() -> None:
    assert describe_exit(137) == "signal SIGKILL (exit code 137)"
    assert describe_exit(-15) == "signal SIGTERM"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(None).startswith("no exit status")


# --- the loop -------------------------------------------------------------------------


def test_loop_stops_every_node_when_a_rank_fails(tmp_path: Path) -> None:
    sessions = [FakeSession(0), FakeSession(1)]
    events: queue.Queue[Event] = queue.Queue()
    states: list[str] = []
    sup = supervisor(
        tmp_path,
        sessions=sessions,
        events=events,
        on_change=lambda s: states.append("stopping" if s.stopping else "running"),
    )
    now = time.time()
    for node in (0, 1):
        events.put(Event(node, "S", (str(100 + node), f"{now:.6f}")))
    events.put(Event(1, "O", ("2",), b"Traceback: boom\n"))
    events.put(Event(1, "E", ("2", "1", f"{now + 1:.6f}")))
    events.put(Event(0, "X", ("143", f"{now + 2:.6f}")))
    events.put(Event(1, "X", ("1", f"{now + 2:.6f}")))
    outcome = sup.run()
    assert sessions[0].sent[-1] == "stop 3" and sessions[1].sent[-1] == "stop 3"
    assert (outcome.state, outcome.exit_code) == ("failed", 1)
    assert "rank 2 (local rank 0) on b" in outcome.summary and "Traceback: boom" in outcome.summary
    status = sup.status()
    assert status["stop_reason"] == "rank 2 on b failed"
    assert [r["state"] for r in status["ranks"]] == ["killed", "killed", "failed", "killed"]
    assert "stopping" in states


def test_an_idle_loop_sleeps_long_yet_a_signal_wakes_it_at_once(tmp_path: Path) -> None:
    sessions = [FakeSession(0), FakeSession(1)]
    events: queue.Queue[Event | None] = queue.Queue()
    sup = supervisor(
        tmp_path,
        sessions=sessions,
        events=events,
        supervision=Supervision(grace=3, heartbeat_timeout=60, hang_timeout=0),
    )
    assert sup.pause() == IDLE_TICK_S == 2.0  # nothing happens: one wake-up in 2 s
    now = time.time()
    for node in (0, 1):
        events.put(Event(node, "S", (str(100 + node), f"{now:.6f}")))
    took: list[float] = []

    def interrupt_then_end() -> None:
        time.sleep(2.3)  # the loop waits for an event, up to 2 s at a time
        sent = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)
        while "stop 3" not in sessions[0].sent and time.monotonic() < sent + 5:
            time.sleep(0.005)
        took.append(time.monotonic() - sent)
        for node in (0, 1):
            events.put(Event(node, "X", ("143", f"{time.time():.6f}")))

    helper = threading.Thread(target=interrupt_then_end)
    helper.start()
    with signals_to(sup):
        outcome = sup.run()
    helper.join()
    assert sup.stopper.interrupted_by == signal.SIGINT and outcome.state == "stopped", outcome
    assert took[0] < 0.3 * IDLE_TICK_S, f"the stop went out {took[0]:.2f} s after SIGINT"


def test_loop_takes_a_w_frame_for_the_nodes_disk(tmp_path: Path) -> None:
    sessions = [FakeSession(0), FakeSession(1)]
    events: queue.Queue[Event] = queue.Queue()
    sup = supervisor(tmp_path, sessions=sessions, events=events)
    now = time.time()
    for node in (0, 1):
        events.put(Event(node, "S", (str(100 + node), f"{now:.6f}")))
    events.put(Event(1, "W", ("ENOSPC", f"{now + 1.1:.6f}"), b"~/.orchestrator/runs/x/node1"))
    events.put(Event(1, "E", ("2", "1", f"{now + 1:.6f}", "0")))
    events.put(Event(1, "E", ("3", "143", f"{now + 1.2:.6f}", "1")))
    events.put(Event(0, "X", ("143", f"{now + 2:.6f}")))
    events.put(Event(1, "X", ("1", f"{now + 2:.6f}")))
    outcome = sup.run()
    assert sessions[0].sent[-1] == "stop 3"
    assert (outcome.state, outcome.exit_code) == ("failed", 1)
    assert outcome.summary.startswith(
        "job failed: b: no space left on device in ~/.orchestrator/runs/x/node1"
    )
    node_b = sup.status()["nodes"][1]
    assert node_b["detail"] == "no space left on device in ~/.orchestrator/runs/x/node1"


# --- restarts (torchrun --max-restarts) ----------------------------------------------


def restarting_detector() -> tuple[Detector, Stopper, Notes]:
    nodes, ranks = world()
    notes = Notes()
    stopper = Stopper(nodes, [], notes, grace=1)
    return Detector(nodes, ranks, notes, stopper, max_restarts=2), stopper, notes


def one_round(det: Detector, t0: float, failing: int, code: int = 3) -> None:
    """Every rank ends once: `failing` first, the others stopped by their torchrun after."""
    assert det.rank_exited(failing, code, t0) is None
    for rank in range(4):
        if rank != failing:
            assert det.rank_exited(rank, 143, t0 + 0.5 + rank) is None


def test_a_failure_with_restarts_left_is_a_restart_named_by_its_first_rank() -> None:
    det, stopper, notes = restarting_detector()
    t0 = det.started_wall
    det.rank_exited(1, 143, t0 + 6)  # reported first, but rank 2 failed before it
    det.rank_exited(2, 3, t0 + 5)
    det.rank_exited(0, 143, t0 + 6.1)
    assert not [n for n in notes.notes if "torchrun restarts" in n]  # rank 3 may fail first
    det.rank_exited(3, 143, t0 + 6.2)
    assert not stopper.stopping
    assert {r.state for r in det.ranks.values()} == {"restarting"}
    assert [n for n in notes.notes if "torchrun restarts the workers" in n] == [
        "rank 2 on b failed with exit code 3; torchrun restarts the workers "
        "(--max-restarts 2 per node)"
    ]
    assert det.restart_lines() == ["restart 1: rank 2 on b ended with exit code 3 after 5.0 s"]
    for rank in range(4):  # the second attempt succeeds
        det.rank_exited(rank, 0, t0 + 20)
    for node in det.nodes:
        assert det.node_exited(node, 0, t0 + 21) is None
    outcome = det.outcome()
    assert (outcome.state, outcome.exit_code) == ("succeeded", 0)
    assert outcome.summary == (
        "restarted 1 time(s) (--max-restarts 2):\n"
        "  restart 1: rank 2 on b ended with exit code 3 after 5.0 s"
    )


def test_when_torchrun_gives_up_the_last_round_is_the_failure() -> None:
    det, stopper, _ = restarting_detector()
    t0 = det.started_wall
    one_round(det, t0 + 1, failing=2)
    one_round(det, t0 + 10, failing=0, code=-11)
    one_round(det, t0 + 20, failing=2, code=4)
    # torchrun on b has used its 2 restarts: its node script fails, the run stops.
    assert det.node_exited(det.nodes[1], 1, t0 + 25) == "b failed"
    stopper.begin(1, "b failed")
    det.node_exited(det.nodes[0], 143, t0 + 26)
    outcome = det.outcome()
    assert (outcome.state, outcome.exit_code) == ("failed", 4)
    assert outcome.summary.startswith(
        "job failed: rank 2 (local rank 0) on b ended with exit code 4 after 20.0 s"
    )
    assert outcome.summary.endswith(
        "restarted 2 time(s) (--max-restarts 2):\n"
        "  restart 1: rank 2 on b ended with exit code 3 after 1.0 s\n"
        "  restart 2: rank 0 on a ended with signal SIGSEGV after 10.0 s"
    )
    assert det.ranks[2].state == "failed"


def test_exits_from_our_own_stop_are_not_restarts() -> None:
    det, stopper, _ = restarting_detector()
    stopper.begin(1, "SIGINT to the orchestrator")
    det.rank_exited(0, 143, time.time() + 1)
    assert det.ranks[0].state == "stopped" and det.restart_lines() == []


def test_loop_counts_a_restart_and_sees_the_rank_again(tmp_path: Path) -> None:
    events: queue.Queue[Event] = queue.Queue()
    seen: list[dict] = []
    sup = supervisor(
        tmp_path,
        sessions=[FakeSession(0), FakeSession(1)],
        events=events,
        max_restarts=1,
        on_change=lambda s: seen.append(s.status()),
    )
    now = time.time()
    # Each in a pass of its own, as they come on a run: the status is told as a pass ends.
    sup.step(Event(1, "E", ("3", "1", f"{now:.6f}")), handle)
    assert seen[-1]["restarts"] == 1 and seen[-1]["ranks"][3]["state"] == "restarting"
    sup.step(Event(1, "O", ("3",), b"attempt 1\n"), handle)
    assert seen[-1]["ranks"][3]["state"] == "running"  # its output came again
    for rank in range(4):
        events.put(Event(rank // 2, "E", (str(rank), "0", f"{now + 5:.6f}")))
    for node in (0, 1):
        events.put(Event(node, "X", ("0", f"{now + 6:.6f}")))
    told = len(seen)
    outcome = sup.run()
    assert outcome.state == "succeeded" and "restart 1: rank 3 on b" in outcome.summary
    assert sup.status()["restarts"] == 1 and not sup.stopping
    # Told as the loop began, once for the six events of its one pass, and at the end.
    assert len(seen) - told == 3 and seen[-1] == sup.status()


def test_closing_lines_name_the_restarts_on_success_and_the_summary_on_failure() -> None:
    assert Outcome("succeeded", 0).closing_lines("r1", 2.04, "runs/r1/logs") == [
        "run r1 succeeded in 2.0 s"
    ]
    assert Outcome("succeeded", 0, "restart 1: rank 2").closing_lines("r1", 2.0, "x") == [
        "restart 1: rank 2",
        "run r1 succeeded in 2.0 s",
    ]
    assert Outcome("failed", 3, "rank 1 failed").closing_lines("r1", 5.0, "runs/r1/logs") == [
        "rank 1 failed",
        "run r1 failed (exit code 3) after 5.0 s; logs in runs/r1/logs",
    ]


def test_ranks_torchrun_ended_after_their_node_mate_failed_were_stopped() -> None:
    """Rank 1 fails (exit 3); its torchrun ends rank 0 with SIGTERM before our stop reaches
    the node, and that exit may even be reported first: rank 0 was stopped, rank 1 failed."""
    det, stopper, _ = detector()
    now = time.time()
    assert det.rank_exited(0, 143, now - 0.9) == "rank 0 on a failed"  # reported first
    stopper.begin(1, "rank 0 on a failed")
    assert det.rank_exited(1, 3, now - 1) is None
    det.rank_exited(2, 143, now, after_stop=True)
    det.rank_exited(3, 143, now, after_stop=True)
    outcome = det.outcome()
    assert [det.ranks[r].state for r in range(4)] == ["stopped", "failed", "stopped", "stopped"]
    assert (outcome.state, outcome.exit_code) == ("failed", 3)
    assert "rank 1 (local rank 1) on a ended with exit code 3" in outcome.summary


def test_a_sigterm_nobody_on_its_node_explains_is_a_failure() -> None:
    det, _, _ = detector()
    assert det.rank_exited(2, 143, time.time()) == "rank 2 on b failed"
    det.outcome()
    assert det.ranks[2].state == "failed"
