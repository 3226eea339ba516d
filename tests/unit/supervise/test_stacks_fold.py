"""Folding ranks' stacks (orchestrator.supervise.stack_groups): alike stacks are one group
whatever the thread ids, names, order or the way they were taken; the odd group comes first
with the user's innermost frames; a rank without a stack is a group naming why; and two
samples tell a rank whose main thread moved or works from one whose main thread waits,
whatever its other threads do."""

from __future__ import annotations

from orchestrator.supervise.stack_groups import fold, moved, render_groups, stack_key
from orchestrator.supervise.stack_names import innermost_user_frames, is_user_frame, short_file

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
TRAIN = "/home/u/job/train.py"


def frame(function: str, file: str, line: int | None) -> dict:
    return {"function": function, "file": file, "line": line}


def all_reduce_frames() -> list[dict]:
    return [
        frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2931),
        frame("_exception_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
        frame("step", TRAIN, 30),
        frame("main", TRAIN, 60),
        frame("<module>", TRAIN, 64),
    ]


def stuck_frames() -> list[dict]:
    return [frame("stuck_here", TRAIN, 41), frame("main", TRAIN, 60), frame("<module>", TRAIN, 64)]


def pin_memory_thread(ident: int) -> dict:
    frames = [
        frame("wait", f"{STDLIB}/threading.py", 331),
        frame("get", f"{STDLIB}/queue.py", 180),
        frame("_pin_memory_loop", f"{SITE}/torch/utils/data/_utils/pin_memory.py", 52),
        frame("run", f"{STDLIB}/threading.py", 982),
    ]
    return {"name": None, "id": ident, "idle": True, "frames": frames}


def record(rank: int, frames: list[dict], *, ident: int = 0, ticks: int = 0, **more) -> dict:
    threads = [{"name": "MainThread", "id": 1000 + rank + ident, "idle": None, "frames": frames}]
    return {
        "rank": rank,
        "pid": 100 + rank,
        "method": "signal",
        "threads": threads + more.pop("threads", []),
        "taken_at": 0.0,
        "pause_s": None,
        "main_cpu_ticks": ticks,
        "error": None,
        **more,
    }


HOSTS = {rank: f"node{rank // 2 + 1}" for rank in range(8)}


def test_the_odd_rank_is_a_group_of_its_own_shown_first_with_its_user_frames() -> None:
    records = [record(r, all_reduce_frames()) for r in range(8) if r != 5]
    records.append(record(5, stuck_frames()))
    groups = fold(records, HOSTS)
    assert [g.ranks for g in groups] == [(5,), (0, 1, 2, 3, 4, 6, 7)]
    assert [g.label for g in groups] == ["node3 r5", "node[1-4] r[0-4,6-7]"]
    assert render_groups(groups) == [
        "[node3 r5] 1 rank: main thread in stuck_here (train.py:41) <- main (train.py:60)"
        " <- <module> (train.py:64)",
        "[node[1-4] r[0-4,6-7]] 7 ranks: main thread in all_reduce"
        " (torch/distributed/distributed_c10d.py:2931) <- step (train.py:30)"
        " <- main (train.py:60) <- <module> (train.py:64)",
    ]


def test_among_groups_of_one_size_the_rank_in_its_own_code_comes_first() -> None:
    """Two ranks: rank 0 waits in the all_reduce, rank 1 is stuck in its own function; the
    stuck one is named first, though its rank is higher."""
    groups = fold([record(0, all_reduce_frames()), record(1, stuck_frames())], HOSTS)
    assert [g.ranks for g in groups] == [(1,), (0,)]


def test_thread_ids_names_order_and_the_way_taken_do_not_split_a_group() -> None:
    spy = record(0, all_reduce_frames(), threads=[pin_memory_thread(7)])
    spy["method"] = "py-spy"
    hooked = record(1, all_reduce_frames(), ident=55, threads=[pin_memory_thread(9)])
    hooked["threads"].reverse()  # another order
    for thread in hooked["threads"]:  # faulthandler names functions without their class
        for f in thread["frames"]:
            f["function"] = f["function"].rpartition(".")[2]
        thread["name"] = None
    assert stack_key(spy) == stack_key(hooked)
    assert [g.ranks for g in fold([spy, hooked], HOSTS)] == [(0, 1)]


def test_a_different_line_is_a_different_stack() -> None:
    moved_on = all_reduce_frames()
    moved_on[2] = frame("step", TRAIN, 31)
    groups = fold([record(0, all_reduce_frames()), record(1, moved_on)], HOSTS)
    assert [g.ranks for g in groups] == [(0,), (1,)]  # a tie in size: the lowest rank first


def test_ranks_without_a_stack_are_a_group_naming_why() -> None:
    why = "py-spy: not found on this node; stack hook: no stack hook in this process"
    failed = record(6, [], error=why, method=None)
    failed["threads"] = []
    ended = record(7, [], error="process 107 has ended", method=None)
    records = [record(r, all_reduce_frames()) for r in range(6)] + [failed, ended]
    lines = render_groups(fold(records, HOSTS))
    assert lines[:2] == [
        f"[node4 r6] 1 rank: no stack: {why}",
        "[node4 r7] 1 rank: no stack: process 107 has ended",
    ]
    assert lines[2].startswith("[node[1-3] r[0-5]] 6 ranks: main thread in all_reduce")


def test_a_group_shows_the_main_thread_then_user_threads_and_counts_library_threads() -> None:
    saver = {
        "name": "saver",
        "id": 3,
        "idle": False,
        "frames": [frame("write", f"{STDLIB}/shutil.py", 200), frame("save_loop", TRAIN, 12)],
    }
    rec = record(0, stuck_frames(), threads=[pin_memory_thread(2), saver])
    assert render_groups(fold([rec], HOSTS)) == [
        "[node1 r0] 1 rank: main thread in stuck_here (train.py:41) <- main (train.py:60)"
        " <- <module> (train.py:64)",
        "    thread saver in write (shutil.py:200) <- save_loop (train.py:12)",
        "    and 1 other thread",
    ]


def test_user_frames_skip_the_standard_library_packages_and_our_hook() -> None:
    frames = [
        frame("wait", f"{STDLIB}/threading.py", 327),
        frame("select", "/opt/conda/lib/python3.10/selectors.py", 469),
        frame("hook", "/n/stacks/stack_hook/sitecustomize.py", 3),
        frame("_call_with_frames_removed", "<frozen importlib._bootstrap>", 241),
        frame("forward", "/usr/lib/python3/dist-packages/mylib/layer.py", 9),
        frame("loop", TRAIN, 20),
        frame("main", TRAIN, 60),
    ]
    assert [f["function"] for f in innermost_user_frames(frames, n=1)] == ["loop"]
    assert not any(map(is_user_frame, frames[:5]))
    library_only = frames[:2]
    assert innermost_user_frames(library_only) == library_only  # none: the innermost frames


def test_files_are_shown_within_their_package_or_by_name() -> None:
    assert short_file(f"{SITE}/torch/cuda/__init__.py") == "torch/cuda/__init__.py"
    assert short_file("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py") == "threading.py"
    assert short_file(TRAIN) == "train.py"
    assert short_file("/home/u/job/model/__init__.py") == "model/__init__.py"
    assert short_file("<string>") == "<string>"


CLK_TCK = 100


def test_a_rank_moved_when_its_stack_changed() -> None:
    later = all_reduce_frames()
    later[2] = frame("step", TRAIN, 33)
    assert moved(record(0, all_reduce_frames()), record(0, later), 5.0, CLK_TCK)


def test_a_tight_loop_of_the_user_s_code_works_without_moving() -> None:
    loop = [frame("spin", TRAIN, 3), frame("<module>", TRAIN, 9)]
    first, second = record(0, loop, ticks=1000), record(0, loop, ticks=1000 + 450)
    assert moved(first, second, 5.0, CLK_TCK)  # 90% of a core
    idle = record(0, loop, ticks=1000 + 100)  # 20%: not a loop that works
    assert not moved(first, idle, 5.0, CLK_TCK)


def test_a_loop_on_a_loaded_node_works_by_the_core_time_it_wanted() -> None:
    """Given a tenth of a core, a loop still wanted all of it (ran or waited to run)."""
    loop = [frame("spin", TRAIN, 3), frame("<module>", TRAIN, 9)]
    first = record(0, loop, ticks=1000, main_cpu_wanted_ns=10**9)
    second = record(0, loop, ticks=1000 + 50, main_cpu_wanted_ns=10**9 + 49 * 10**8)
    assert moved(first, second, 5.0, CLK_TCK)
    nap = [frame("nap", TRAIN, 5)]
    asleep = (
        record(0, nap, ticks=0, main_cpu_wanted_ns=10**9),
        record(0, nap, main_cpu_wanted_ns=10**9 + 1),
    )
    assert not moved(*asleep, 5.0, CLK_TCK)


def test_a_wait_that_spins_a_core_has_not_moved() -> None:
    """A collective or a CUDA synchronize may spin: innermost in torch, it is waiting."""
    first = record(0, all_reduce_frames(), ticks=0)
    second = record(0, all_reduce_frames(), ticks=500)
    assert not moved(first, second, 5.0, CLK_TCK)
    waits = [frame("wait", f"{STDLIB}/threading.py", 327), frame("main", TRAIN, 5)]
    assert not moved(record(0, waits, ticks=0), record(0, waits, ticks=500), 5.0, CLK_TCK)


def test_a_main_thread_seen_idle_does_not_work() -> None:
    nap = [frame("nap", TRAIN, 5)]  # time.sleep has no Python frame: the user's is innermost
    first, second = record(0, nap, ticks=0), record(0, nap, ticks=500)
    second["threads"][0]["idle"] = True  # py-spy saw it idle between two CPU readings
    assert not moved(first, second, 5.0, CLK_TCK)


def test_only_the_main_thread_counts_as_moving() -> None:
    """A pin-memory loop's stack changes while the rank is stuck in an all_reduce."""
    other = pin_memory_thread(2)
    other["frames"][0] = frame("get", f"{STDLIB}/queue.py", 171)
    first = record(0, all_reduce_frames(), threads=[pin_memory_thread(2)])
    second = record(0, all_reduce_frames(), threads=[other])
    assert not moved(first, second, 5.0, CLK_TCK)
    assert stack_key(first) != stack_key(second)  # yet the two are not folded together


def memory_logger(line: int) -> dict:
    """A thread of the user's that prints a line every 2 s: at its print, or its sleep."""
    frames = [frame("report_memory", TRAIN, line), frame("run", f"{STDLIB}/threading.py", 982)]
    return {"name": "logger", "id": 9, "main": False, "idle": line == 8, "frames": frames}


def deadlocked(logger_line: int, main_ticks: int = 3) -> dict:
    """A rank whose main thread (renamed `trainer`) waits on a lock it already holds, and
    has burned `main_ticks`, while its logging thread prints."""
    lock = [frame("take_the_lock_twice", TRAIN, 21), frame("<module>", TRAIN, 40)]
    each = record(1, lock, threads=[memory_logger(logger_line)], ticks=main_ticks)
    each["threads"][0].update(name="trainer", main=True, idle=True)
    return each


def test_a_printing_thread_does_not_move_a_deadlocked_main_thread() -> None:
    """The logger is caught at its print, then at its sleep (the user's code, its stack
    changed); the main thread, in the same frame, burned nothing. The rank has not moved;
    it has where its main thread went on, or burned a core in its own code."""
    first, second = deadlocked(7), deadlocked(8)
    assert not moved(first, second, 5.0, CLK_TCK)
    went_on = deadlocked(8)
    went_on["threads"][0]["frames"][0] = frame("take_the_lock_twice", TRAIN, 22)
    assert moved(first, went_on, 5.0, CLK_TCK)
    spun = deadlocked(8, main_ticks=3 + 450)
    spun["threads"][0]["idle"] = False
    assert moved(first, spun, 5.0, CLK_TCK)


def test_the_main_thread_is_the_one_marked_whatever_its_name() -> None:
    """A thread named MainThread that is not the main one (marked so) is not judged; a
    record that marks no thread is read by the name."""
    first, second = deadlocked(7), deadlocked(7)
    impostor = memory_logger(7)
    impostor.update(name="MainThread", main=False)
    changed = {**impostor, "frames": [frame("report_memory", TRAIN, 8)]}
    first["threads"].append(impostor)
    second["threads"].append(changed)
    assert not moved(first, second, 5.0, CLK_TCK)
    unmarked = record(0, stuck_frames())  # named MainThread, no mark: the main thread
    later = record(0, [frame("stuck_here", TRAIN, 42), *stuck_frames()[1:]])
    assert moved(unmarked, later, 5.0, CLK_TCK)
    assert render_groups(fold([first], HOSTS))[0].startswith(
        "[node1 r1] 1 rank: main thread in take_the_lock_twice (train.py:21)"
    )


def test_a_record_without_a_stack_has_not_moved() -> None:
    failed = record(0, [], error="process 100 has ended")
    assert not moved(record(0, stuck_frames()), failed, 5.0, CLK_TCK)


def test_a_loop_of_collectives_caught_twice_at_one_line_moved_a_stuck_one_did_not() -> None:
    """Innermost in torch both times: woken hundreds of times between (each all_reduce that
    finished) it works; woken once or twice (taking the stack) it waits for ever. A user's
    polling sleep is judged by its CPU, not by how often it wakes."""
    working = (
        record(0, all_reduce_frames(), main_wakeups=1000),
        record(0, all_reduce_frames(), main_wakeups=1000 + 400),
    )
    assert moved(*working, 5.0, CLK_TCK)
    stuck = (
        record(0, all_reduce_frames(), main_wakeups=1000),
        record(0, all_reduce_frames(), main_wakeups=1002),
    )
    assert not moved(*stuck, 5.0, CLK_TCK)
    unknown = (record(0, all_reduce_frames()), record(0, all_reduce_frames(), main_wakeups=9))
    assert not moved(*unknown, 5.0, CLK_TCK)
    polling = [frame("wait_for_a_batch", TRAIN, 14), frame("<module>", TRAIN, 20)]
    asleep = (
        record(0, polling, main_wakeups=10, main_cpu_wanted_ns=10**9),
        record(0, polling, main_wakeups=20, main_cpu_wanted_ns=10**9 + 10**6),
    )
    assert not moved(*asleep, 5.0, CLK_TCK)
