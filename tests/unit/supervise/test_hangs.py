"""Hang checks, pure: when a check begins (progress postpones it a whole timeout, output a
lull at most), how its two samples are judged (by the ranks' main threads, whatever their
other threads print), and the round of stacks a request gets, through the run record. (The
same end to end, with real ranks, real agents and real torchrun:
tests/cluster/test_hangs_cluster.py and tests/local/test_hangs_local.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

from orchestrator.supervise.hangs import LULL_S, SAMPLE_GAP_S, HangWatch
from orchestrator.supervise.stack_rounds import StackRounds, answer_to, ask_for_stacks
from tests.factories import FakeSession, supervisor

HOSTS = {0: "a", 1: "a", 2: "b", 3: "b"}


def record(rank: int, function: str, line: int, ticks: int = 0) -> dict:
    frames = [{"function": function, "file": "/job/train.py", "line": line}]
    frames.append({"function": "<module>", "file": "/job/train.py", "line": 90})
    return {
        "rank": rank,
        "pid": 100 + rank,
        "method": "py-spy",
        "threads": [{"name": "MainThread", "id": 1, "idle": True, "frames": frames}],
        "taken_at": 0.0,
        "pause_s": 0.001,
        "main_cpu_ticks": ticks,
        "error": None,
    }


def stuck_world(ticks: int = 0) -> dict[int, list[dict]]:
    """Rank 3 waits in a function of its own; the others in the same line of train.py."""
    return {
        0: [record(0, "step", 30, ticks), record(1, "step", 30, ticks)],
        1: [record(2, "step", 30, ticks), record(3, "wait_for_data", 12, ticks)],
    }


def answer(rounds: StackRounds, sessions: list[FakeSession], world: dict[int, list[dict]]) -> None:
    for session in sessions:
        seq = session.sent[-1].split()[1]
        rounds.received(session.index, seq, json.dumps(world[session.index]).encode())


def make(tmp_path: Path, notes: list[str]) -> tuple[StackRounds, HangWatch, list[FakeSession]]:
    sessions = [FakeSession(0), FakeSession(1)]
    rounds = StackRounds(sessions, HOSTS, {0: "a", 1: "b"}, tmp_path, notes.append)
    return rounds, HangWatch(rounds, 60.0, notes.append, now=0.0), sessions


def check(rounds, watch, sessions, now, first, second):
    """One whole check from `now`: two samples answered with `first` and `second`."""
    watch.tick(now, {0, 1}, True)
    answer(rounds, sessions, first)
    (ended,) = rounds.tick(now + 1)
    assert watch.round_ended(ended, now + 1) is None
    watch.tick(now + 6, {0, 1}, True)
    answer(rounds, sessions, second)
    (ended,) = rounds.tick(now + 7)
    return watch.round_ended(ended, now + 7)


def test_no_check_before_the_timeout_nor_while_a_node_is_not_running(tmp_path):
    rounds, watch, sessions = make(tmp_path, [])
    watch.tick(59.0, {0, 1}, True)
    watch.tick(61.0, {0}, False)
    assert [s.sent for s in sessions] == [[], []]
    watch.tick(61.0, {0, 1}, True)
    assert [s.sent for s in sessions] == [["stacks 1 auto"], ["stacks 1 auto"]]


def test_the_loop_reads_the_nodes_only_while_a_check_is_due_or_under_way(tmp_path):
    rounds, watch, sessions = make(tmp_path, [])
    assert not watch.waiting(59.0)  # quiet and not due: the supervisor skips tick
    assert watch.waiting(60.0)
    watch.tick(60.0, {0, 1}, True)
    assert not watch.waiting(61.0)  # the first round is out
    answer(rounds, sessions, stuck_world())
    (ended,) = rounds.tick(61.0)
    watch.round_ended(ended, 61.0)
    assert watch.waiting(62.0)  # between the samples: a node that stops ends the check
    watch.tick(62.0, {0}, False)
    assert watch.waiting(63.0)  # still due: a new check begins once every node runs
    assert [s.sent for s in sessions] == [["stacks 1 auto"], ["stacks 1 auto"]]
    assert not HangWatch(rounds, 0.0, print, now=0.0).waiting(1e9)  # --hang-timeout 0


def test_a_run_where_nothing_moved_hangs_and_names_the_odd_rank_first(tmp_path):
    notes: list[str] = []
    rounds, watch, sessions = make(tmp_path, notes)
    hang = check(rounds, watch, sessions, 60.0, stuck_world(), stuck_world())
    assert hang is not None and notes == []
    lines = hang.console_lines()
    assert lines[0].startswith("hung: no new step and no main thread moved for 67 s")
    assert (
        lines[1]
        == "[b r3] 1 rank: main thread in wait_for_data (train.py:12) <- <module> (train.py:90)"
    )
    assert lines[2].startswith("[a,b r[0-2]] 3 ranks: main thread in step (train.py:30)")
    assert hang.summary().splitlines()[0].startswith("job hung: no rank moved for 67 s; [b r3]")
    kept = json.loads((hang.stacks.folder / "stacks.json").read_text())
    assert kept["groups"] == lines[1:] and len(kept["ranks"]) == 4
    assert "wait_for_data" in (hang.stacks.folder / "rank-3.txt").read_text()


def test_a_stack_that_changed_is_work_said_once_and_checked_again_later(tmp_path):
    notes: list[str] = []
    rounds, watch, sessions = make(tmp_path, notes)
    later = stuck_world()
    later[1][1] = record(3, "wait_for_data", 13)
    assert check(rounds, watch, sessions, 60.0, stuck_world(), later) is None
    (note,) = notes  # the samples' interval is their wall clocks': here, instants apart
    assert note.startswith("no new step for 67 s, but the main thread of rank 3 moved between")
    assert note.endswith(" s apart: working")
    watch.tick(100.0, {0, 1}, True)  # moving is progress: the next check a timeout later
    assert sessions[0].sent == ["stacks 1 auto", "stacks 2 auto flight"]
    assert check(rounds, watch, sessions, 127.0, stuck_world(), later) is None
    assert len(notes) == 1  # said once


def test_a_tight_loop_in_the_users_code_is_work(tmp_path):
    notes: list[str] = []
    rounds, watch, sessions = make(tmp_path, notes)
    busy = stuck_world(ticks=10_000)  # 100 s of CPU at 100 ticks/s between the samples
    for records in busy.values():
        for each in records:
            each["threads"][0]["idle"] = False
    assert check(rounds, watch, sessions, 60.0, stuck_world(), busy) is None
    assert notes[0].endswith(": working")


def test_a_line_postpones_a_due_check_until_a_lull_and_by_the_lull_at_most(tmp_path):
    rounds, watch, sessions = make(tmp_path, [])
    watch.heard(57.0)  # the last line 3 s before the check is due: it waits for a lull
    assert not watch.waiting(60.0) and watch.begins_at() == 57.0 + LULL_S
    for now in range(58, 70, 2):  # a line every 2 s: no lull; the check begins all the same
        watch.heard(float(now))
    assert watch.begins_at() == 60.0 + LULL_S
    watch.tick(60.0 + LULL_S - 0.1, {0, 1}, True)
    assert sessions[0].sent == []
    watch.tick(60.0 + LULL_S, {0, 1}, True)
    assert sessions[0].sent == ["stacks 1 auto"]


def test_a_line_cancels_neither_a_check_nor_its_second_sample(tmp_path):
    """A rank's logging thread prints every 2 s while every main thread stays where it
    was: the check goes on and finds the hang."""
    rounds, watch, sessions = make(tmp_path, [])
    watch.tick(60.0, {0, 1}, True)
    watch.heard(60.5)
    answer(rounds, sessions, stuck_world())
    (ended,) = rounds.tick(61.0)
    assert watch.round_ended(ended, 61.0) is None
    watch.heard(62.0)
    watch.heard(64.0)
    watch.tick(61.0 + SAMPLE_GAP_S, {0, 1}, True)
    assert sessions[0].sent == ["stacks 1 auto", "stacks 2 auto flight"]
    answer(rounds, sessions, stuck_world())
    (ended,) = rounds.tick(67.0)
    assert watch.round_ended(ended, 67.0) is not None


def test_progress_cancels_a_check_under_way_and_postpones_the_next_a_timeout(tmp_path):
    rounds, watch, sessions = make(tmp_path, [])
    watch.tick(60.0, {0, 1}, True)
    answer(rounds, sessions, stuck_world())
    watch.progressed(60.5)  # a rank reported a new step
    (ended,) = rounds.tick(61.0)
    assert watch.round_ended(ended, 61.0) is None
    watch.tick(70.0, {0, 1}, True)
    assert len(sessions[0].sent) == 1  # no second sample; the next check at 120.5
    watch.tick(120.4, {0, 1}, True)
    assert len(sessions[0].sent) == 1
    watch.tick(120.5, {0, 1}, True)
    assert len(sessions[0].sent) == 2


def printing_thread(line: int) -> dict:
    """A memory logger's thread: at its print or its sleep, whichever the sample caught."""
    frames = [
        {"function": "report_memory", "file": "/job/train.py", "line": line},
        {"function": "run", "file": "/usr/lib/python3.11/threading.py", "line": 982},
    ]
    return {"name": "logger", "id": 2, "main": False, "idle": line == 7, "frames": frames}


def printing_world(deadlocked: int, logger_line: int) -> dict[int, list[dict]]:
    """Every rank's main thread waits in a collective but `deadlocked`'s, which waits on a
    lock of its own; every rank's logging thread is at `logger_line`; the process burns
    CPU (the logger's), its main thread none."""
    world = {}
    for node, ranks in ((0, (0, 1)), (1, (2, 3))):
        world[node] = []
        for rank in ranks:
            each = (
                record(rank, "take_the_lock_twice", 21)
                if rank == deadlocked
                else record(rank, "all_reduce_wait", 30)
            )
            each["threads"][0]["name"] = "trainer"  # renamed: still the main thread
            each["threads"][0]["main"] = True
            each["threads"].append(printing_thread(logger_line))
            each["main_cpu_wanted_ns"] = 10**9
            world[node].append(each)
    return world


def test_ranks_that_print_while_their_main_threads_stay_put_are_found_hung(tmp_path):
    """Lines every 2 s from every rank's logging thread, whose stacks and CPU change
    between the samples: the check still begins (a lull at most after it is due), goes on,
    and names the deadlocked rank first, within the timeout and 30 s."""
    notes: list[str] = []
    rounds, watch, sessions = make(tmp_path, notes)
    found, now, asked = None, 0.0, 0
    while found is None and now < 120.0:
        if now % 2 == 0:
            watch.heard(now)
        watch.tick(now, {0, 1}, True)
        if len(sessions[0].sent) > asked:
            asked = len(sessions[0].sent)
            answer(rounds, sessions, printing_world(1, 6 if asked == 1 else 7))
        for ended in rounds.tick(now):
            found = watch.round_ended(ended, now) or found
        now += 0.5
    assert found is not None and notes == [], notes
    assert found.quiet_s <= 60.0 + 30.0
    assert found.stacks.odd == (1,)
    assert found.console_lines()[1].startswith(
        "[a r1] 1 rank: main thread in take_the_lock_twice (train.py:21)"
    )


def test_a_new_step_on_the_metrics_channel_is_progress_a_repeated_one_is_not(tmp_path):
    """Through the frame handlers, as the agent's frames arrive: a rank's output and a
    metrics record that repeats its step leave the check due; a new step puts it off."""

    from orchestrator.backends.sessions import Event
    from orchestrator.options.supervision import Supervision
    from orchestrator.supervise.frame_handlers import handle

    supervision = Supervision(heartbeat_timeout=30, hang_timeout=60)
    sup = supervisor(tmp_path, ("a",), supervision=supervision)
    due = sup.hangs.next_check

    def frame(kind: str, payload: bytes) -> float:
        handle(sup, Event(0, kind, ("1",), payload))
        return sup.hangs.next_check

    assert frame("O", b"memory 1.2 GB\n") == due
    assert frame("Q", b'{"step": 7, "loss": 2.5}\n') > due  # its first step
    due = sup.hangs.next_check
    assert frame("Q", b'{"step": 7, "loss": 2.4}\n') == due  # the same step again
    assert frame("Q", b'{"loss": 2.3}\n') == due  # no step
    assert frame("Q", b'{"step": 8}\n') > due


def test_ranks_not_started_yet_are_no_hang_and_no_note(tmp_path):
    notes: list[str] = []
    rounds, watch, sessions = make(tmp_path, notes)
    early = {0: [], 1: []}
    assert check(rounds, watch, sessions, 60.0, early, stuck_world()) is None
    assert notes == []


def test_a_request_through_the_record_is_answered_by_a_round(tmp_path):
    rounds, _, sessions = make(tmp_path, [])
    assert rounds.requests() == []
    ask_for_stacks(tmp_path, "abc123", "signal")
    assert rounds.requests() == [("abc123", "signal")]
    assert rounds.requests() == []  # taken once
    asked = rounds.begin("asked", {0, 1}, "signal", "abc123")
    assert sessions[1].sent == [f"stacks {asked.seq} signal"]
    answer(rounds, sessions, stuck_world())
    assert answer_to(tmp_path, "abc123") is None
    (ended,) = rounds.tick(1.0)
    got = answer_to(tmp_path, "abc123")
    assert answer_to(tmp_path, "abc123", since=time.time() + 60) is None  # older: not read
    assert got["folder"] == str(ended.folder) and got["groups"][0].startswith("[b r3]")
    assert {r["host"] for r in got["ranks"]} == {"a", "b"}


def test_a_node_that_does_not_answer_is_named_when_the_round_times_out(tmp_path):
    rounds, _, sessions = make(tmp_path, [])
    rounds.begin("asked", {0, 1}, "auto", "r1")
    rounds.received(0, sessions[0].sent[-1].split()[1], json.dumps(stuck_world()[0]).encode())
    assert rounds.tick(5.0) == []
    (ended,) = rounds.tick(1e9)
    assert ended.lines[-1] == "[b] no answer within 12 s"


def test_a_hang_ends_the_stuck_ranks_while_torchrun_has_restarts_left(tmp_path):
    """--max-restarts 2: the first hang sends `end 3` to rank 3's node alone and watches
    anew; once the restarts are spent, a hang is left to end the run."""
    from orchestrator.supervise.detect import Detector
    from orchestrator.supervise.restarts import RankExit
    from orchestrator.supervise.state import NodeState, RankState

    notes: list[str] = []
    rounds, watch, sessions = make(tmp_path, notes)
    hang = check(rounds, watch, sessions, 60.0, stuck_world(), stuck_world())
    assert hang is not None and hang.stacks.odd == (3,)
    nodes = [NodeState(0, "a", (0, 1)), NodeState(1, "b", (2, 3))]
    ranks = [RankState(r, r // 2, r % 2, HOSTS[r]) for r in range(4)]
    detector = Detector(nodes, ranks, None, None, max_restarts=2)  # type: ignore[arg-type]
    assert watch.said_or_restarted(hang, detector, sessions, 80.0)
    assert sessions[1].sent[-1] == "end 3" and sessions[0].sent[-1].startswith("stacks")
    assert notes[-1] == (
        "ending rank 3 so that torchrun restarts the workers (restart 1 of --max-restarts 2)"
    )
    assert watch.next_check == 80.0 + 60.0  # the new workers get a whole timeout
    detector.rounds.causes = {0: RankExit(3, "b", 137, 1.0), 1: RankExit(3, "b", 137, 2.0)}
    assert not watch.said_or_restarted(hang, detector, sessions, 200.0)
    assert sessions[1].sent[-1] == "end 3" and len(sessions[1].sent) == 3  # nothing more sent


def test_a_round_with_the_flight_recorder_waits_for_its_dumps_longer(tmp_path):
    from orchestrator.supervise.stack_rounds import FLIGHT_EXTRA_S, ROUND_TIMEOUT_S

    rounds, _, sessions = make(tmp_path, [])
    plain = rounds.begin("plain", {0, 1})
    flight = rounds.begin("flight", {0, 1}, flight=True)
    assert plain is not None and flight is not None
    start = max(plain.began, flight.began)
    assert rounds.tick(start + ROUND_TIMEOUT_S) == [plain]  # the other still has time
    (ended,) = rounds.tick(start + ROUND_TIMEOUT_S + FLIGHT_EXTRA_S)
    assert ended is flight and ended.missing == {0, 1}
    assert sessions[0].sent == ["stacks 1 auto", "stacks 2 auto flight"]
