"""Taking ranks' stacks on a node (orchestrator.agent.stacks, stack_hook/sitecustomize.py)
from real processes: a tight loop, a sleep in a function of its own, a wait on an Event, and
a gloo all_reduce that its peer never joins, a main thread deadlocked on a lock while
another thread prints and burns CPU; with py-spy and with the signal hook; the hook signals
nothing that did not announce it, and leaves the program and its own sitecustomize as they
were."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.agent.ranks import rank_pids
from orchestrator.agent.stacks import (
    HOOK_FOLDER,
    hook_environment,
    take_stacks,
)
from orchestrator.supervise.stack_groups import fold, moved, render_groups
from tests.factories import free_port, wait_for

HOOK = str(Path(__file__).resolve().parents[2] / "orchestrator" / "agent" / HOOK_FOLDER)
CLK_TCK = os.sysconf("SC_CLK_TCK")
TIMEOUT = 10.0

TRIO = """\
import sys, threading, time
def spin():
    while True: pass
def nap():
    time.sleep(1000)
def wait_forever():
    threading.Event().wait()
{"spin": spin, "nap": nap, "wait": wait_forever}[sys.argv[1]]()
"""
LINES = {"spin": 3, "nap": 5, "wait": 7}  # where each waits or loops, in TRIO
RANK_OF = {"spin": 0, "nap": 1, "wait": 2}


def py_spy_path() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return found if os.access(found, os.X_OK) else None


def started(argv: list[str], env: dict[str, str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, **kwargs)


def exist(paths: list[Path]) -> Callable[[], bool]:
    return lambda: all(p.exists() for p in paths)


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[int, int], Path, Path]]:
    """({rank: pid} of the spinner, the sleeper and the waiter, hook dir, their script)."""
    folder = tmp_path_factory.mktemp("trio")
    script, hook_dir = folder / "trio.py", folder / "stacks"
    script.write_text(TRIO)
    env = hook_environment(dict(os.environ), HOOK, str(hook_dir))
    procs = {kind: started([sys.executable, str(script), kind], env) for kind in RANK_OF}
    try:
        wait_for(exist([hook_dir / f"{p.pid}.ready" for p in procs.values()]), 60, "ready files")
        yield {RANK_OF[kind]: p.pid for kind, p in procs.items()}, hook_dir, script
    finally:
        stop(list(procs.values()))


@pytest.fixture(scope="module")
def py_spy(trio: tuple[dict[int, int], Path, Path]) -> str:
    found = py_spy_path()
    if found is None:
        pytest.skip("py-spy is not installed: pip install py-spy==0.4.3 (a binary wheel)")
    ranks, hook_dir, _ = trio
    check = take_stacks({0: ranks[1]}, str(hook_dir), found, TIMEOUT)[0]
    if check["method"] != "py-spy" and "ptrace" in (check["error"] or ""):
        pytest.skip(f"py-spy may not read processes here: {check['error']}")
    return found


def main_frames(record: dict) -> list[dict]:
    assert record["error"] is None, record
    (main,) = [t for t in record["threads"] if t["main"]]
    assert main["name"] == "MainThread"
    return main["frames"]


def check_trio(records: dict[int, dict], script: Path, method: str) -> None:
    assert sorted(records) == [0, 1, 2]
    for kind, rank in RANK_OF.items():
        rec = records[rank]
        assert rec["method"] == method and rec["rank"] == rank
        assert isinstance(rec["main_cpu_ticks"], int) and rec["taken_at"] <= time.time()
        assert isinstance(rec["main_cpu_wanted_ns"], int)  # this kernel keeps schedstat
        frames = main_frames(rec)
        own = [f for f in frames if f["file"] == str(script)]
        assert own[-1] == {"function": "<module>", "file": str(script), "line": 8}
        function = {"spin": "spin", "nap": "nap", "wait": "wait_forever"}[kind]
        assert own[0] == {"function": function, "file": str(script), "line": LINES[kind]}
        if kind == "wait":  # innermost: threading's Condition.wait (py-spy: with its class)
            assert frames[0]["file"].endswith("threading.py")
            assert frames[0]["function"].rpartition(".")[2] == "wait"
        else:
            assert frames[0] is own[0]


def test_py_spy_reads_every_rank_and_its_pause_is_measured(
    trio: tuple[dict[int, int], Path, Path], py_spy: str
) -> None:
    ranks, hook_dir, script = trio
    records = take_stacks(ranks, str(hook_dir), py_spy, TIMEOUT)
    check_trio(records, script, "py-spy")
    for rec in records.values():
        assert 0.0 < rec["pause_s"] < TIMEOUT
    idle = {rank: main_thread(records[rank])["idle"] for rank in ranks}
    assert idle == {0: False, 1: True, 2: True}


def main_thread(record: dict) -> dict:
    return next(t for t in record["threads"] if t["main"])


def test_the_signal_hook_reads_every_rank_without_py_spy(
    trio: tuple[dict[int, int], Path, Path],
) -> None:
    ranks, hook_dir, script = trio
    for _ in range(2):  # a second dump is told from the first (the file only grows)
        records = take_stacks(ranks, str(hook_dir), None, TIMEOUT)
        check_trio(records, script, "signal")
    assert all(rec["pause_s"] is None for rec in records.values())
    stacks = (hook_dir / f"{ranks[2]}.stacks").read_text()
    assert stacks.count("(most recent call first)") == 2


def test_py_spy_missing_falls_back_to_the_hook(trio: tuple[dict[int, int], Path, Path]) -> None:
    ranks, hook_dir, script = trio
    records = take_stacks({1: ranks[1]}, str(hook_dir), str(hook_dir / "no-py-spy"), TIMEOUT)
    assert records[1]["method"] == "signal"
    assert main_frames(records[1])[0]["function"] == "nap"


def two_samples(ranks: dict[int, int], hook_dir: Path, py_spy: str | None) -> list[bool]:
    first = take_stacks(ranks, str(hook_dir), py_spy, TIMEOUT)
    time.sleep(1.0)
    second = take_stacks(ranks, str(hook_dir), py_spy, TIMEOUT)
    return [
        moved(first[r], second[r], second[r]["taken_at"] - first[r]["taken_at"], CLK_TCK)
        for r in sorted(ranks)
    ]


def test_two_samples_tell_the_tight_loop_from_the_sleep_and_the_wait(
    trio: tuple[dict[int, int], Path, Path],
) -> None:
    ranks, hook_dir, _ = trio
    assert two_samples(ranks, hook_dir, None) == [True, False, False]
    spy = py_spy_path()
    if spy is not None:
        assert two_samples(ranks, hook_dir, spy) == [True, False, False]


PRINTS_WHILE_DEADLOCKED = """\
import threading, time
def report_memory():
    while True:
        sum(i * i for i in range(200_000))
        print("memory", flush=True)
def take_the_lock_twice(lock):
    lock.acquire()
    lock.acquire()
threading.Thread(target=report_memory, name="logger", daemon=True).start()
threading.current_thread().name = "trainer"
take_the_lock_twice(threading.Lock())
"""


def test_a_deadlocked_main_thread_has_not_moved_while_another_thread_prints_and_works(
    tmp_path: Path,
) -> None:
    """Whatever its name, the main thread is the one marked, by py-spy (its kernel thread
    id is the pid) and by the hook (its ident); its CPU is its own: the logging thread
    burns a core and its stack changes, the main thread waits on its lock and has not
    moved."""
    script, hook_dir = tmp_path / "prints.py", tmp_path / "stacks"
    script.write_text(PRINTS_WHILE_DEADLOCKED)
    env = hook_environment(dict(os.environ), HOOK, str(hook_dir))
    proc = started([sys.executable, str(script)], env, stdout=subprocess.DEVNULL)
    try:
        wait_for(exist([hook_dir / f"{proc.pid}.ready"]), 60, "a ready file")
        time.sleep(0.5)
        for spy in dict.fromkeys((None, py_spy_path())):
            first = take_stacks({1: proc.pid}, str(hook_dir), spy, TIMEOUT)[1]
            time.sleep(1.0)
            second = take_stacks({1: proc.pid}, str(hook_dir), spy, TIMEOUT)[1]
            for rec in (first, second):
                (main,) = [t for t in rec["threads"] if t["main"]]
                assert main["frames"][0]["function"] == "take_the_lock_twice", rec
                assert main["frames"][0]["line"] == 8, rec
            interval = second["taken_at"] - first["taken_at"]
            assert second["main_cpu_ticks"] - first["main_cpu_ticks"] <= 1
            assert not moved(first, second, interval, CLK_TCK), (first, second)
        if py_spy_path() is not None:
            assert main["name"] == "trainer" and second["method"] == "py-spy"
    finally:
        stop([proc])


def test_nothing_is_signalled_that_did_not_announce_the_hook(tmp_path: Path) -> None:
    """The hook's signal would end a process without it: a process with no ready file, a
    ready file of an earlier process of the pid, or one that does not catch the signal
    (here a ready file forged for a `sleep`) is left alone, and the record says why."""
    hook_dir = tmp_path / "stacks"
    hook_dir.mkdir()
    bare = started([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
    sleeper = started(["sleep", "60"], dict(os.environ))
    forged = started(["sleep", "60"], dict(os.environ))
    try:
        time.sleep(0.3)
        with open(f"/proc/{forged.pid}/stat", "rb") as handle:
            start = handle.read().rsplit(b")", 1)[1].split()[19].decode()
        signum = int(signal.SIGRTMIN) + 5
        for proc, when in ((sleeper, "1"), (forged, start)):
            ready = f"signal {signum}\nstart {when}\nmain_thread 1\n"
            (hook_dir / f"{proc.pid}.ready").write_text(ready)
        ranks = {0: bare.pid, 1: sleeper.pid, 2: forged.pid}
        records = take_stacks(ranks, str(hook_dir), py_spy_path(), TIMEOUT)
        errors = {rank: records[rank]["error"] for rank in ranks}
        assert "stack hook: no stack hook in this process" in errors[1]
        assert "an earlier process's with pid" in errors[1]
        assert f"no longer catches signal {signum}" in errors[2]
        if py_spy_path() is not None:  # py-spy reads the bare interpreter; not `sleep`
            assert records[0]["method"] == "py-spy"
            assert "py-spy: Failed to find python version" in errors[1]
        else:
            assert errors[0] == "py-spy: not found on this node; stack hook: " + (
                "no stack hook in this process (started before the hook, not Python, or "
                "Python run with -I or -S)"
            )
        assert [p.poll() for p in (bare, sleeper, forged)] == [None, None, None]
    finally:
        stop([bare, sleeper, forged])


def test_an_ended_process_is_named() -> None:
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # never a process
    record = take_stacks({4: gone}, "/nonexistent", None, 1.0)[4]
    assert record["error"] == f"process {gone} has ended" and record["method"] is None


def test_rank_pids_are_the_topmost_python_process_of_each_rank(tmp_path: Path) -> None:
    """bash run_rank (RANK) -> python (the rank) -> python (its DataLoader worker, same RANK);
    a rank that is no Python process at all still has its topmost holder
    (here a bash)."""
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import subprocess, sys, time\n"
        "if len(sys.argv) > 1:\n"
        "    child = subprocess.Popen([sys.executable, __file__])\n"
        f"    open({str(tmp_path)!r} + '/' + sys.argv[1], 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    py = sys.executable
    script = (
        f"RANK=0 bash -c '{py} {worker} r0; true' & RANK=1 bash -c '{py} {worker} r1; true' & "
        "RANK=2 bash -c 'sleep 60; true' & wait"
    )
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    root = started(["bash", "-c", script], env, start_new_session=True)
    try:
        wait_for(exist([tmp_path / "r0", tmp_path / "r1"]), 60, "ranks")
        time.sleep(0.2)
        found = rank_pids(root.pid)
        assert sorted(found) == [0, 1, 2]
        for rank in (0, 1):
            assert Path(f"/proc/{found[rank]}/exe").resolve().name.startswith("python")
            assert int((tmp_path / f"r{rank}").read_text()) != found[rank]  # not the worker
            cmdline = Path(f"/proc/{found[rank]}/cmdline").read_bytes().split(b"\0")
            assert cmdline[-2] == f"r{rank}".encode()
        assert Path(f"/proc/{found[2]}/cmdline").read_bytes().startswith(b"bash\0-c\0sleep")
    finally:
        os.killpg(root.pid, signal.SIGKILL)  # the group of the shell we started: all of it
        root.wait()


GLOO = """\
import datetime, os, sys, time
import torch, torch.distributed as dist
rank, port, marker = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def step(t):
    dist.all_reduce(t)
def idle():
    time.sleep(120)
def main():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=120))
    open(marker, "w").close()
    step(torch.ones(4)) if rank == 0 else idle()
main()
"""


@pytest.mark.slow
def test_the_hook_dumps_a_main_thread_blocked_in_a_gloo_all_reduce(tmp_path: Path) -> None:
    script, hook_dir = tmp_path / "gloo_rank.py", tmp_path / "stacks"
    script.write_text(GLOO)
    env = hook_environment(dict(os.environ), HOOK, str(hook_dir))
    port = str(free_port())
    markers = [tmp_path / f"joined{r}" for r in (0, 1)]
    procs = [
        started([sys.executable, str(script), str(r), port, str(markers[r])], env) for r in (0, 1)
    ]
    try:
        wait_for(exist(markers), 90, "process group")
        time.sleep(0.5)  # rank 0 is inside the all_reduce now, and stays there
        ranks = {r: p.pid for r, p in enumerate(procs)}
        for py_spy in (None, py_spy_path()) if py_spy_path() else (None,):
            records = take_stacks(ranks, str(hook_dir), py_spy, TIMEOUT)
            frames = main_frames(records[0])
            assert frames[0]["function"] == "all_reduce"
            assert frames[0]["file"].endswith("torch/distributed/distributed_c10d.py")
            assert [f["function"] for f in frames if f["file"] == str(script)] == [
                "step",
                "main",
                "<module>",
            ]
            lines = render_groups(fold(list(records.values()), {0: "node1", 1: "node1"}))
            # groups of one size: the rank in its own code (idle) before the one in torch
            assert lines[0].startswith("[node1 r1] 1 rank: main thread in idle (gloo_rank.py:7)")
            assert lines[1].startswith("[node1 r0] 1 rank: main thread in all_reduce (torch/")
            assert " <- step (gloo_rank.py:5) <- main (gloo_rank.py:12)" in lines[1]
        assert [p.poll() for p in procs] == [None, None]
    finally:
        stop(procs)
