"""Where a stack is named (orchestrator.supervise.stack_names) and a rank's child processes
in the folded stacks (stack_groups): a thread is named by the library call its deepest frame
of the user's made and that frame, with the innermost frame beside them; a rank's
DataLoader worker is shown under it, makes ranks differ, puts a rank stuck on it first, and
counts as moving by the same two-sample rule as a main thread."""

from __future__ import annotations

from orchestrator.supervise.stack_groups import fold, moved, render_groups, stack_key
from orchestrator.supervise.stack_names import library_call, thread_text

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
TRAIN = "/home/u/job/train.py"
LOADER = f"{SITE}/torch/utils/data/dataloader.py"


def frame(function: str, file: str, line: int) -> dict:
    return {"function": function, "file": file, "line": line}


def waiting_on_the_loader() -> list[dict]:
    """The main thread of a rank in `for batch in loader`, as py-spy read it."""
    return [
        frame("_PollLikeSelector.select", f"{STDLIB}/selectors.py", 415),
        frame("wait", f"{STDLIB}/multiprocessing/connection.py", 947),
        frame("Queue.get", f"{STDLIB}/multiprocessing/queues.py", 113),
        frame("_MultiProcessingDataLoaderIter._try_get_data", LOADER, 1291),
        frame("_MultiProcessingDataLoaderIter._next_data", LOADER, 1505),
        frame("_BaseDataLoaderIter.__next__", LOADER, 725),
        frame("train", TRAIN, 26),
        frame("<module>", TRAIN, 35),
    ]


def in_the_dataset(line: int = 21) -> list[dict]:
    """The worker's main thread, in the user's Dataset (below it, the frames it was forked
    from)."""
    return [
        frame("PipeDataset.__getitem__", TRAIN, line),
        frame("fetch", f"{SITE}/torch/utils/data/_utils/fetch.py", 54),
        frame("_worker_loop", f"{SITE}/torch/utils/data/_utils/worker.py", 374),
        frame("train", TRAIN, 26),
        frame("<module>", TRAIN, 35),
    ]


def idle_worker() -> list[dict]:
    return [
        frame("Condition.wait", f"{STDLIB}/threading.py", 327),
        frame("Queue.get", f"{STDLIB}/multiprocessing/queues.py", 103),
        frame("_worker_loop", f"{SITE}/torch/utils/data/_utils/worker.py", 320),
    ]


def all_reduce() -> list[dict]:
    return [
        frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 3252),
        frame("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
        frame("<module>", TRAIN, 37),
    ]


def process(pid: int, frames: list[dict], **more) -> dict:
    thread = {"name": "MainThread", "id": 7, "main": True, "idle": True, "frames": frames}
    return {"pid": pid, "method": "py-spy", "threads": [thread], "error": None, **more}


def child(pid: int, frames: list[dict], **more) -> dict:
    return {"parent": 100, "name": "pt_data_worker", **process(pid, frames, **more)}


def rank(number: int, frames: list[dict], children: list[dict] = (), **more) -> dict:
    return {"rank": number, **process(100 + number, frames, **more), "children": list(children)}


HOSTS = {0: "node1", 1: "node2"}


def test_a_wait_on_the_loader_is_named_by_the_loaders_call_and_the_users_line() -> None:
    """Not by selectors.select, the innermost frame: that is shown beside them."""
    assert thread_text(waiting_on_the_loader()) == (
        "_MultiProcessingDataLoaderIter._try_get_data (torch/utils/data/dataloader.py:1291)"
        " <- train (train.py:26) <- <module> (train.py:35);"
        " innermost _PollLikeSelector.select (selectors.py:415)"
    )


def test_the_library_call_is_the_innermost_frame_of_the_library_the_user_called() -> None:
    """torch's all_reduce, not its logging wrapper (the frame the user called); queue's
    get, not threading's wait; nothing where the user's own frame is innermost, or no
    frame is the user's."""
    assert library_call(all_reduce())["function"] == "all_reduce"
    assert thread_text(all_reduce()) == (
        "all_reduce (torch/distributed/distributed_c10d.py:3252) <- <module> (train.py:37)"
    )
    queue_get = [
        frame("wait", f"{STDLIB}/threading.py", 327),
        frame("get", f"{STDLIB}/queue.py", 180),
        frame("loop", TRAIN, 20),
    ]
    assert thread_text(queue_get) == (
        "get (queue.py:180) <- loop (train.py:20); innermost wait (threading.py:327)"
    )
    assert library_call(in_the_dataset()) is None
    assert thread_text(in_the_dataset()).startswith("PipeDataset.__getitem__ (train.py:21) <- ")
    assert library_call(idle_worker()) is None
    assert thread_text(idle_worker()) == (
        "Condition.wait (threading.py:327) <- Queue.get (multiprocessing/queues.py:103)"
        " <- _worker_loop (torch/utils/data/_utils/worker.py:320)"
    )


def test_a_rank_stuck_on_its_worker_shows_the_worker_and_comes_first() -> None:
    """Two ranks: rank 0 in the all_reduce, rank 1 waiting on its worker, which reads in
    the user's Dataset. Rank 1 comes first (in the user's code, through its worker), its
    worker's frame under its main thread."""
    stuck = rank(1, waiting_on_the_loader(), [child(201, in_the_dataset())])
    lines = render_groups(fold([rank(0, all_reduce()), stuck], HOSTS))
    assert lines[0].startswith(
        "[node2 r1] 1 rank: main thread in _MultiProcessingDataLoaderIter._try_get_data"
    )
    assert lines[1] == (
        "    child process pt_data_worker: main thread in PipeDataset.__getitem__"
        " (train.py:21) <- train (train.py:26) <- <module> (train.py:35)"
    )
    assert lines[2].startswith("[node1 r0] 1 rank: main thread in all_reduce")


def test_alike_children_fold_and_those_in_the_users_code_come_first() -> None:
    """Four workers, three idle alike and one reading: two lines, the reader first; a
    child that is not Python is named; past CHILDREN_SHOWN kinds and those not taken are
    counted."""
    workers = [child(201 + i, idle_worker()) for i in range(3)] + [child(204, in_the_dataset())]
    tool = {**child(205, []), "name": "rsync", "method": None, "error": "not Python (rsync)"}
    other = {**child(206, [frame("serve", f"{STDLIB}/socketserver.py", 9)]), "name": "x"}
    record = rank(0, waiting_on_the_loader(), [*workers, tool, other], children_left=2)
    lines = render_groups(fold([record], HOSTS))[1:]
    assert lines[0].startswith("    child process pt_data_worker: main thread in PipeDataset")
    assert lines[1].startswith("    3 child processes pt_data_worker: main thread in Condition")
    assert lines[2] in (
        "    child process rsync: no stack: not Python (rsync)",
        "    child process x: main thread in serve (socketserver.py:9)",
    )
    assert lines[3] == "    and 3 other child processes"


def test_children_are_part_of_the_stack_key_their_pids_are_not() -> None:
    one = rank(0, all_reduce(), [child(201, idle_worker())])
    same = rank(1, all_reduce(), [child(301, idle_worker())])
    reading = rank(1, all_reduce(), [child(301, in_the_dataset())])
    assert stack_key(one) == stack_key(same) != stack_key(reading)
    assert stack_key(rank(0, all_reduce())) == stack_key(rank(1, all_reduce(), []))


def test_a_worker_that_moved_is_working_one_that_did_not_is_stuck() -> None:
    """The main thread waits on the loader in both samples; the rank moved where its
    worker's stack changed (or it spun in the user's code), not where the worker stayed
    put, nor for a child seen in one sample only."""
    waiting = waiting_on_the_loader()

    def sample(worker: dict) -> dict:
        return rank(1, waiting, [worker], main_wakeups=10)

    first = sample(child(201, in_the_dataset(21), main_cpu_wanted_ns=0))
    assert moved(first, sample(child(201, in_the_dataset(22))), 5.0, 100)
    busy = child(201, in_the_dataset(21), main_cpu_wanted_ns=4 * 10**9)
    busy["threads"][0]["idle"] = False
    assert moved(first, sample(busy), 5.0, 100)
    stuck = child(201, in_the_dataset(21), main_cpu_wanted_ns=10**6)
    assert not moved(first, sample(stuck), 5.0, 100)
    assert not moved(first, sample(child(202, in_the_dataset(22))), 5.0, 100)
