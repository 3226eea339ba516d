"""Many ranks' stacks read like a folded console: alike ones are one group, the odd one first.

The records come from the nodes (orchestrator.agent.stacks: one per rank, every thread's
frames innermost first). Ranks whose stacks are the same (`stack_key`: the same functions,
files and lines in every thread; thread ids, names and addresses aside) are one `Group`;
groups are shown smallest first, so the rank that is not where all the others are comes
first, with its innermost frames of the user's own code (LLNL's STAT merges stacks the same
way):

    [node3 r5] 1 rank: main thread in stuck_here (train.py:41) <- main (train.py:60)
    [node[1-4] r[0-4,6-7]] 7 ranks: main thread in all_reduce (torch/distributed/dist...

A rank whose stack could not be taken is a group of its own, named by why.

Two records of a rank taken some seconds apart tell a hang from work (`moved`), by its
main thread.

Pure: records in, groups and lines out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.hostlist import compress_hosts

BUSY_SHARE = 0.5  # of one core over the interval: a main thread wanting this much is busy
WOKEN_PER_S = 2.0  # a main thread woken this often in a library call keeps finishing calls
USER_FRAMES = 3  # frames of the user's code shown per thread
THREADS_SHOWN = 3  # threads shown per group (the main thread first); the rest are counted
# Where code is not the user's: installed packages (torch and the rest), the interpreter's
# standard library (threading, queue, selectors, ...), and our own stack hook.
_INSTALLED = re.compile(r"/(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/|/python\d+\.zip/")
_HOOK = "/stack_hook/sitecustomize.py"


@dataclass(frozen=True)
class Group:
    """Ranks with the same stack (or the same reason none was taken)."""

    ranks: tuple[int, ...]  # ascending
    hosts: tuple[str, ...]  # their hosts, each once, in rank order
    record: dict  # the lowest rank's record: the stack shown for all

    @property
    def error(self) -> str | None:
        return self.record.get("error")

    @property
    def label(self) -> str:
        """`node[1-4] r[0-4,6-7]`, as the folded console names ranks."""
        ranks = compress_hosts(f"r{rank}" for rank in self.ranks)
        return f"{compress_hosts(self.hosts)} {ranks}"


def frame_key(frame: dict) -> tuple[str, str, int]:
    """A frame as compared: py-spy names a method `Event.wait`, faulthandler `wait`, so only
    the last part of the name counts, and ranks read either way still compare."""
    line = frame.get("line")
    return (
        str(frame.get("function") or "").rpartition(".")[2],
        str(frame.get("file") or ""),
        line if isinstance(line, int) else -1,
    )


def thread_key(thread: dict) -> tuple[tuple[str, str, int], ...]:
    return tuple(frame_key(frame) for frame in thread.get("frames") or ())


def stack_key(record: dict) -> tuple:
    """What two ranks share when their stacks are the same: every thread's frames, the
    threads in sorted order (their order, ids and names aside); threads without a Python
    frame say nothing and are left out. A record without a stack: ("error", why)."""
    if record.get("error"):
        return ("error", record["error"])
    return tuple(sorted(key for key in map(thread_key, record.get("threads") or ()) if key))


def fold(records: list[dict], hosts: dict[int, str]) -> list[Group]:
    """Groups of ranks with equal stack keys: smallest first; among groups of one size,
    those whose main thread is in the user's own code before those waiting in a library (a
    collective), so in a 2-rank job the stuck rank still comes first; then by lowest rank."""
    by_key: dict[tuple, list[dict]] = {}
    for record in sorted(records, key=lambda r: r["rank"]):
        by_key.setdefault(stack_key(record), []).append(record)
    groups = [
        Group(
            ranks=tuple(r["rank"] for r in members),
            hosts=tuple(dict.fromkeys(hosts.get(r["rank"], "?") for r in members)),
            record=members[0],
        )
        for members in by_key.values()
    ]
    return sorted(groups, key=lambda g: (len(g.ranks), not in_own_code(g.record), g.ranks[0]))


def in_own_code(record: dict) -> bool:
    """Whether the record's main thread (else its first) has its innermost frame in the
    user's code."""
    threads = record.get("threads") or ()
    frames = (main_thread(record) or (threads[0] if threads else {})).get("frames") or ()
    return bool(frames) and is_user_frame(frames[0])


def is_main(thread: dict) -> bool:
    """Whether a record's thread is its process's main thread: as the agent marks it
    ("main", whatever the thread's name), else by its name (a record that marks none)."""
    main = thread.get("main")
    return main if isinstance(main, bool) else thread.get("name") == "MainThread"


def main_thread(record: dict) -> dict | None:
    """A record's main thread; None where it names none (no stack)."""
    return next((t for t in record.get("threads") or () if is_main(t)), None)


def is_user_frame(frame: dict) -> bool:
    """Whether a frame is the user's code: not an installed package, not the standard
    library, not our hook, not frozen start-up code."""
    path = str(frame.get("file") or "")
    if path.startswith("<frozen"):
        return False
    return not (_INSTALLED.search(path) or _STDLIB.search(path) or path.endswith(_HOOK))


def innermost_user_frames(frames: list[dict], n: int = USER_FRAMES) -> list[dict]:
    """The `n` innermost frames of the user's code in a thread's frames (innermost first);
    where there are none, the `n` innermost frames."""
    return [frame for frame in frames if is_user_frame(frame)][:n] or frames[:n]


def short_file(path: str) -> str:
    """A frame's file as shown: within its package or the standard library
    (`torch/distributed/distributed_c10d.py`, `threading.py`), else the file's name
    (`train.py`; `model/__init__.py` for a package's)."""
    for pattern in (_INSTALLED, _STDLIB):
        ends = [found.end() for found in pattern.finditer(path)]
        if ends:
            return path[ends[-1] :]
    parts = path.rsplit("/", 2)
    if parts[-1] == "__init__.py" and len(parts) > 1:
        return "/".join(parts[-2:])
    return parts[-1]


def frame_text(frame: dict) -> str:
    line = frame.get("line")
    where = short_file(str(frame.get("file") or "?"))
    return f"{frame.get('function') or '?'} ({where}:{line if line is not None else '?'})"


def thread_text(frames: list[dict]) -> str:
    """Where a thread is: its innermost frame where that is not the user's (the call it
    waits in), then the innermost frames of the user's code, outward."""
    if not frames:
        return "no Python frame"
    shown = innermost_user_frames(frames)
    if frames[0] is not shown[0]:
        shown = [frames[0], *shown]
    return " <- ".join(frame_text(frame) for frame in shown)


def threads_to_show(record: dict) -> tuple[list[dict], int]:
    """(the threads a group shows, how many more it has): the main thread, then those with
    the user's code in them, up to THREADS_SHOWN; a thread of library code alone (a
    pin-memory loop, a watchdog) is only counted, unless there is nothing else."""
    threads = [t for t in record.get("threads") or () if t.get("frames")]
    main = [t for t in threads if is_main(t)]
    users = [t for t in threads if t not in main and any(map(is_user_frame, t["frames"]))]
    shown = (main + users)[:THREADS_SHOWN] or threads[:1]
    return shown, len(threads) - len(shown)


def render_groups(groups: list[Group]) -> list[str]:
    """A few console lines per group, the odd group first (the order of `groups`)."""
    lines = []
    for group in groups:
        count = len(group.ranks)
        head = f"[{group.label}] {count} rank{'s' if count != 1 else ''}: "
        if group.error:
            lines.append(f"{head}no stack: {group.error}")
            continue
        shown, others = threads_to_show(group.record)
        if not shown:
            lines.append(f"{head}no Python thread")
            continue
        for index, thread in enumerate(shown):
            name = thread.get("name")
            who = "main thread" if is_main(thread) else f"thread {name or '(no name)'}"
            text = f"{who} in {thread_text(thread['frames'])}"
            lines.append(head + text if index == 0 else f"    {text}")
        if others:
            lines.append(f"    and {others} other thread{'s' if others != 1 else ''}")
    return lines


def moved(first: dict, second: dict, interval_s: float, clk_tck: int) -> bool:
    """Whether a rank's main thread moved between two records taken `interval_s` apart: it
    did where

    - its stack differs (its frames' functions, files and lines), or
    - the stacks are the same but the main thread wanted at least BUSY_SHARE of a core
      between the two, was not seen idle, and has its innermost frame in the user's code:
      a tight loop of the user's. Wanted: the time it ran or waited for a core
      (main_cpu_wanted_ns), so a loop on a node too loaded to give it half a core still
      counts; where a record lacks it, the CPU it burned (main_cpu_ticks, 1/clk_tck s), or
    - the stacks are the same, its innermost frame is a library's (a collective, a queue),
      and it blocked and was woken at least WOKEN_PER_S times a second between the two
      (main_wakeups): calls that finish and are made again, a loop of collectives caught
      twice at the same line, not one call that waits for ever (a stuck collective or a
      lock wakes nobody; taking a stack wakes a thread once or twice; a user's polling
      sleep is the user's frame and still judged by the rule above).

    Only the main thread counts: the one that runs the program's steps. A thread that logs,
    reports progress or watches (a memory logger printing every few seconds, a pin-memory
    loop) moves and burns CPU while the main thread is deadlocked or waits for ever in a
    collective; a job whose work runs in another thread tells its progress through the
    metrics channel (its step) instead. A main thread waiting in a collective, a lock, a
    queue or a sleep has not moved, even where the wait spins a core (its innermost frame
    is then in torch or the standard library; a sleep of the user's burns nothing). Not
    told apart: a call into C made straight from the user's code that spins while it waits
    (`loss.item()` on a GPU that waits for a collective) reads as working; the other ranks'
    stacks still show where they wait. A record without a stack, or without a main thread,
    has not moved (there is nothing to compare).
    """
    if first.get("error") or second.get("error"):
        return False
    before, after = main_thread(first), main_thread(second)
    if before is None or after is None:
        return False
    if thread_key(before) != thread_key(after):
        return True
    frames = after.get("frames") or ()
    if interval_s <= 0 or not frames:
        return False
    if not is_user_frame(frames[0]):
        before_woken, after_woken = first.get("main_wakeups"), second.get("main_wakeups")
        if before_woken is None or after_woken is None:
            return False
        return after_woken - before_woken >= WOKEN_PER_S * interval_s
    busy = busy_seconds(first, second, clk_tck)
    return busy is not None and busy >= BUSY_SHARE * interval_s and not after.get("idle")


def busy_seconds(first: dict, second: dict, clk_tck: int) -> float | None:
    """Seconds of a core the main thread wanted between two records (see `moved`)."""
    before, after = first.get("main_cpu_wanted_ns"), second.get("main_cpu_wanted_ns")
    if before is not None and after is not None:
        return (after - before) / 1e9
    before, after = first.get("main_cpu_ticks"), second.get("main_cpu_ticks")
    if before is None or after is None or clk_tck <= 0:
        return None
    return (after - before) / clk_tck
