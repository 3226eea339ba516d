"""Every rank's Python stacks (all threads), taken on the node at about the same moment.

`take_stacks` reads each rank in a thread of its own, so the ranks of a node are read
within milliseconds of each other. One record per rank (the format `orchestrator stacks`
and the controller's hang check read, see orchestrator.supervise.stack_groups):

    {"rank": 3, "pid": 1234, "method": "py-spy" | "signal" | None,
     "threads": [{"name": "MainThread" | None, "id": 139692972841856 | None,
                  "main": True | False, "idle": True | False | None,
                  "frames": [{"function": "step", "file": "/w/train.py", "line": 30}, ...]}],
     "taken_at": 1764312345.6, "pause_s": 0.012 | None, "main_cpu_ticks": 4567 | None,
     "main_cpu_wanted_ns": 45670000000 | None, "main_wakeups": 812 | None,
     "error": None | "py-spy: ...; stack hook: ..."}

Frames are innermost first. A thread's "id" is Python's thread ident (pthread_t), which both
ways report; "name" is known for every thread with py-spy, for the main thread only with the
signal. "main" marks the process's main thread, the one the hang check judges a rank by
(orchestrator.supervise.stack_groups.moved), whatever its name: py-spy gives each thread's
kernel thread id, and the main thread's is the process's pid; the hook names the main
thread's ident in its ready file. "main_cpu_ticks" (the main thread's utime + stime, from
/proc/PID/task/PID/stat, read just before the stack) lets two records taken some seconds
apart tell a main thread that burns CPU from one that waits, whatever the rank's other
threads (a logger, a watchdog) burn; "main_cpu_wanted_ns" (its time on a core plus time
waiting for one, from /proc/PID/task/PID/schedstat; None where the kernel keeps no such
file) tells the same on a node so loaded that a busy rank gets little of a core: it wanted
the core all the same. "main_wakeups" (the main thread's voluntary context switches, from
/proc/PID/task/PID/status) tells a main thread that keeps blocking and being woken (each
collective it finishes, each lock or queue it gets) from one that waits once, for ever.
Reading them costs three small files a rank.
"method" is None, and "threads" empty, when neither way worked; "error" says why.

Two ways, the first that works:

py-spy (`py-spy dump --pid PID --json`) reads the interpreter's memory from outside: nothing
is needed in the rank, but ptrace must be allowed (kernel.yama.ptrace_scope, CAP_SYS_PTRACE in
a container). We let it stop the process while it reads (no --nonblocking): the stop costs a
rank about 1 ms (0.7 ms with --nonblocking, the reading itself), and --nonblocking reads a
running thread's frames as they change: a torn stack reads as a rank that moved, or splits
ranks that are alike. "pause_s" is the py-spy call's wall time, an upper bound of the stop
(py-spy's own start is most of its 10-30 ms).

The signal: where py-spy is missing or fails, a rank started with our hook on its PYTHONPATH
(orchestrator/agent/stack_hook/sitecustomize.py) writes its own stacks on a signal, from
faulthandler's C handler, so also while its main thread is blocked in C++. Only a process
whose hook announced itself (`<hook_dir>/<pid>.ready`, with the process's start time, so a
reused pid is not taken for it) and which catches the signal now (SigCgt in /proc/PID/status)
is signalled: the signal's default action would end any other. The dump is appended to
`<hook_dir>/<pid>.stacks`; we read what was added after the size noted before the signal,
once the signal is handled: no longer pending, and not blocked by any thread that did not
block it before (a handler blocks its own signal while it runs), seen twice in a row.
"pause_s" is None there: nothing is stopped; one thread runs the handler for the
microseconds the dump takes.

Standard library only: this module runs on the nodes too (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import os
import threading
import time

from orchestrator.agent.processes import own_pid, stat_fields, status_fields
from orchestrator.agent.py_spy import StackError, dump_with_py_spy

TYPE_CHECKING = False  # typing's own costs every agent's start: annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    T = TypeVar("T")

STACKS_DIR_ENV = "ORCHESTRATOR_STACKS_DIR"  # read by the hook: where it announces itself
HOOK_FOLDER = "stack_hook"  # orchestrator/agent/<this>/sitecustomize.py: the hook's folder
HOOK_PATH_ENV = "ORCHESTRATOR_STACK_HOOK"  # the node script's: a job's PYTHONPATH goes after it
POLL_S = 0.005  # how often a signalled rank is checked for its dump being written
NO_HOOK = (
    "no stack hook in this process (started before the hook, not Python, or Python run "
    "with -I or -S)"
)

_locks: dict[int, threading.Lock] = {}  # one dump at a time per process: they share a file
_locks_guard = threading.Lock()


def take_stacks(
    ranks: dict[int, int], hook_dir: str, py_spy: str | None, timeout: float
) -> dict[int, dict]:
    """rank -> its record (see the module docstring), every rank read in parallel.

    Each way gets up to `timeout` seconds, so a rank's record comes within twice that.
    """
    return each_rank(
        ranks,
        lambda rank, pid: with_children(
            take_one(rank, pid, hook_dir, py_spy, timeout), hook_dir, py_spy, timeout
        ),
        lambda rank, pid, why: {**empty_record(rank, pid), "error": why},
    )


def with_children(record: dict, hook_dir: str, py_spy: str | None, timeout: float) -> dict:
    """The rank's record with its child processes' records (orchestrator.agent.child_stacks),
    each child read in a thread of its own, the ways the rank's own stack was tried."""
    from orchestrator.agent.child_stacks import child_record, children_of_rank

    rank, pid = record["rank"], record["pid"]
    pids, left = children_of_rank(pid) if record["main_cpu_ticks"] is not None else ([], 0)

    def take(child: int) -> dict:
        return take_one(rank, child, hook_dir, py_spy, timeout, forked_from=pid)

    found = each_rank(
        {child: child for child in pids},
        lambda child, _: child_record(child, take),
        lambda child, _, why: {"pid": child, "method": None, "threads": [], "error": why},
    )
    return {**record, "children": list(found.values()), "children_left": left}


def each_rank(
    ranks: dict[int, int],
    work: Callable[[int, int], T],
    failed: Callable[[int, int, str], T],
) -> dict[int, T]:
    """rank -> `work(rank, pid)`, every rank in a thread of its own (so they are read at
    about the same moment), by rank; `failed(rank, pid, why)` where `work` raised, so that
    every rank has its answer whatever went wrong."""
    found: dict[int, T] = {}

    def take(rank: int, pid: int) -> None:
        try:
            found[rank] = work(rank, pid)
        except Exception as error:
            found[rank] = failed(rank, pid, f"failed: {error!r}")

    workers = [threading.Thread(target=take, args=item, daemon=True) for item in ranks.items()]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return dict(sorted(found.items()))


def take_one(
    rank: int,
    pid: int,
    hook_dir: str,
    py_spy: str | None,
    timeout: float,
    forked_from: int | None = None,
) -> dict:
    """One rank's record (or, with `forked_from`, the record of that rank's child `pid`):
    py-spy first, then the signal hook."""
    record = empty_record(rank, pid)
    used = main_thread_cpu(pid)
    if used is None:
        record["error"] = f"process {pid} has ended"
        return record
    record["main_cpu_ticks"], record["main_cpu_wanted_ns"], record["main_wakeups"] = used
    reasons = []
    if py_spy:
        try:
            threads, record["pause_s"] = dump_with_py_spy(py_spy, pid, timeout)
            record["threads"], record["method"] = not_ours(threads), "py-spy"
            return record
        except StackError as error:
            reasons.append(f"py-spy: {error}")
    else:
        reasons.append("py-spy: not found on this node")
    try:
        record["threads"] = not_ours(dump_with_hook(pid, hook_dir, timeout, forked_from))
        record["method"] = "signal"
        return record
    except StackError as error:
        reasons.append(f"stack hook: {error}")
    record["error"] = "; ".join(reasons)
    return record


def not_ours(threads: list[dict]) -> list[dict]:
    """The threads without the hook's own (its flight recorder thread, waiting on its pipe):
    every rank has it alike, and it is not the program's."""
    hook = os.path.join(HOOK_FOLDER, "sitecustomize.py")

    def ours(thread: dict) -> bool:
        frames = thread.get("frames") or ()
        return bool(frames) and all(str(f.get("file", "")).endswith(hook) for f in frames)

    return [thread for thread in threads if not ours(thread)]


def empty_record(rank: int, pid: int) -> dict:
    """A record before its stack is taken (taken_at: now)."""
    return {
        "rank": rank,
        "pid": pid,
        "method": None,
        "threads": [],
        "taken_at": time.time(),
        "pause_s": None,
        "main_cpu_ticks": None,
        "main_cpu_wanted_ns": None,
        "main_wakeups": None,
        "error": None,
    }


def main_thread_cpu(pid: int) -> tuple[int, int | None, int | None] | None:
    """(CPU ticks, nanoseconds it ran or waited to run: schedstat's first two fields, its
    voluntary context switches) of the process's main thread, whose thread id is the pid;
    None for a file the kernel does not keep; None where the process has ended."""
    fields = stat_fields(pid, pid)
    if fields is None or fields[0] in (b"Z", b"X"):
        return None
    ticks = int(fields[11]) + int(fields[12])  # utime + stime (stat's 14th and 15th)
    wanted = wakeups = None
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat", "rb") as handle:
            ran, waited = handle.read().split()[:2]
        wanted = int(ran) + int(waited)
    except (OSError, ValueError):
        pass
    found = status_fields(pid, "voluntary_ctxt_switches", task=pid) or {}
    if found.get("voluntary_ctxt_switches", "").isdigit():
        wakeups = int(found["voluntary_ctxt_switches"])
    return ticks, wanted, wakeups


def dump_with_hook(
    pid: int, hook_dir: str, timeout: float, forked_from: int | None = None
) -> list[dict]:
    """The threads the process's hook writes on its signal (see the module docstring). A
    child of process `forked_from` without a hook of its own is read through the hook it
    inherited, where it still holds that process's dump file (orchestrator.agent.child_stacks)."""
    owner, ready = announced(pid, hook_dir, forked_from)
    fields = stat_fields(owner)
    if fields is None:
        raise StackError(f"process {owner} has ended")
    if ready.get("start") != fields[19].decode():  # field 22: when the process started
        raise StackError(NO_HOOK + f" (the ready file is an earlier process's with pid {owner})")
    signum = int(ready["signal"])
    stacks = ready.get("stacks") or os.path.join(hook_dir, f"{own_pid(owner)}.stacks")
    if owner != pid:
        from orchestrator.agent.child_stacks import holds_same_file

        fd = ready.get("fd", "")
        if not fd.isdigit() or not holds_same_file(pid, int(fd), stacks):
            raise StackError(NO_HOOK + f" (nor the hook of process {owner}, its parent)")
    if not catches(pid, signum):
        raise StackError(f"the process no longer catches signal {signum} (its own handler?)")
    with lock_for(owner):  # one dump at a time into the file
        try:
            offset = os.path.getsize(stacks)
        except OSError as error:
            raise StackError(f"cannot read {stacks}: {error.strerror}") from None
        before = blocking_threads(pid, signum)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            raise StackError(f"process {pid} has ended") from None
        except OSError as error:
            raise StackError(f"cannot signal process {pid}: {error.strerror}") from None
        wait_handled(pid, signum, before, time.monotonic() + timeout, timeout)
        with open(stacks, "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    threads = parse_faulthandler(text, int(ready.get("main_thread") or 0) or None)
    if not threads:
        raise StackError(f"the dump in {stacks} holds no thread")
    return threads


def announced(pid: int, hook_dir: str, forked_from: int | None) -> tuple[int, dict[str, str]]:
    """(the process whose hook announced itself for `pid`, its ready file): the process's
    own, else, for a child, the hook of the process it was forked from."""
    try:
        return pid, read_ready(hook_dir, own_pid(pid))  # named by the pid the hook sees
    except StackError:
        if forked_from is None:
            raise
    return forked_from, read_ready(hook_dir, own_pid(forked_from))


def read_ready(hook_dir: str, pid: int) -> dict[str, str]:
    """The hook's ready file as {key: value}; StackError where there is none."""
    try:
        with open(os.path.join(hook_dir, f"{pid}.ready"), encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        raise StackError(NO_HOOK) from None
    ready = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    if not ready.get("signal", "").isdigit():
        raise StackError(f"{NO_HOOK} (a ready file without its signal)")
    return ready


def lock_for(pid: int) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(pid, threading.Lock())


def signal_masks(pid: int, tid: int | str, *names: str) -> list[int] | None:
    """The masks `names` (SigPnd, SigBlk, ShdPnd, SigCgt) of one thread; None if gone."""
    found = status_fields(pid, *names, task=tid)
    try:
        return None if found is None else [int(found.get(name, "0"), 16) for name in names]
    except ValueError:
        return None


def thread_ids(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (its SigCgt bit)."""
    masks = signal_masks(pid, pid, "SigCgt")
    return masks is not None and bool(masks[0] >> (signum - 1) & 1)


def blocking_threads(pid: int, signum: int) -> set[str]:
    """The threads that block `signum` now (before it is sent)."""
    bit = 1 << (signum - 1)
    return {
        tid
        for tid in thread_ids(pid)
        if (masks := signal_masks(pid, tid, "SigBlk")) is not None and masks[0] & bit
    }


def handled(pid: int, signum: int, before: set[str]) -> bool:
    """Whether `signum` is neither pending nor in a handler (which blocks it) anywhere."""
    bit = 1 << (signum - 1)
    for tid in thread_ids(pid):
        masks = signal_masks(pid, tid, "SigPnd", "ShdPnd", "SigBlk")
        if masks is None:
            continue  # the thread has ended
        pending, shared, blocked = masks
        if (pending | shared) & bit or (tid not in before and blocked & bit):
            return False
    return True


def wait_handled(pid: int, signum: int, before: set[str], deadline: float, timeout: float) -> None:
    """Until the signal has been handled, seen twice POLL_S apart: the kernel takes it off
    the pending set a moment before it blocks it for the handler, and one look could fall
    in between; two cannot, for one signal."""
    seen = False
    while True:
        if stat_fields(pid) is None:
            raise StackError(f"process {pid} ended while writing its stacks")
        done = handled(pid, signum, before)
        if done and seen:
            return
        seen = done
        if time.monotonic() >= deadline:
            bit = 1 << (signum - 1)
            masks = signal_masks(pid, pid, "ShdPnd") or [0]
            why = "is still pending (the process is stopped?)" if masks[0] & bit else "is running"
            raise StackError(f"no dump within {timeout:g} s: the signal {why}")
        time.sleep(POLL_S)


def parse_faulthandler(text: str, main_thread: int | None) -> list[dict]:
    """faulthandler's dump of all threads (`Thread 0x00007f0cc4e1f6c0 (most recent call
    first):` or `Current thread ...`, then `  File "/w/train.py", line 12 in step` lines) as
    a record's threads, innermost frame first."""
    threads: list[dict] = []
    for line in text.splitlines():
        if line.endswith("(most recent call first):"):
            words = line.split()
            ident = next((int(w, 16) for w in words if w.startswith("0x")), None)
            main = ident is not None and ident == main_thread
            name = "MainThread" if main else None
            threads.append({"name": name, "id": ident, "main": main, "idle": None, "frames": []})
        elif line.startswith('  File "') and threads:
            path, _, rest = line[len('  File "') :].rpartition('", line ')
            number, _, function = rest.partition(" in ")
            threads[-1]["frames"].append(
                {
                    "function": function,
                    "file": path,
                    "line": int(number) if number.isdigit() else None,
                }
            )
    return threads


def hook_environment(env: dict[str, str], hook_folder: str, hook_dir: str) -> dict[str, str]:
    """`env` for the node script: the hook's folder first on PYTHONPATH, `hook_dir` named,
    and the folder as HOOK_PATH_ENV, which the script puts before a job's own PYTHONPATH."""
    path = env.get("PYTHONPATH")
    return {
        **env,
        "PYTHONPATH": f"{hook_folder}{os.pathsep}{path}" if path else hook_folder,
        STACKS_DIR_ENV: hook_dir,
        HOOK_PATH_ENV: hook_folder,
    }
