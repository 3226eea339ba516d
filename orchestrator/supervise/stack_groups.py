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

A rank's child processes (DataLoader workers) are shown under its threads, alike ones
folded, and part of what makes two ranks alike:

    [node3 r5] 1 rank: main thread in _MultiProcessingDataLoaderIter._try_get_data (torch/...
        child process pt_data_worker: main thread in FifoDataset.__getitem__ (train.py:14)...

Each thread is named by stack_names.thread_text: the library call the deepest frame of the
user's made, that frame and those outside it, and the innermost frame beside them.

Two records of a rank taken some seconds apart tell a hang from work (`moved`), by its
main thread and those of its child processes.

Pure: records in, groups and lines out.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.hostlist import compress_hosts
from orchestrator.supervise.stack_names import is_user_frame, thread_text

BUSY_SHARE = 0.5  # of one core over the interval: a main thread wanting this much is busy
WOKEN_PER_S = 2.0  # a main thread woken this often in a library call keeps finishing calls
THREADS_SHOWN = 3  # threads shown per group (the main thread first); the rest are counted
CHILDREN_SHOWN = 3  # lines of child processes shown per group; the rest are counted


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
    threads = tuple(sorted(key for key in map(thread_key, record.get("threads") or ()) if key))
    children = tuple(sorted(map(child_key, record.get("children") or ())))
    return (threads, children) if children else threads


def child_key(child: dict) -> tuple:
    """A child process as compared: its name and its stack (its pid aside)."""
    return (str(child.get("name") or ""), stack_key({**child, "children": ()}))


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
    """Whether the record's main thread (else its first), or that of a child process of
    the rank (a DataLoader worker in the user's Dataset), has its innermost frame in the
    user's code."""
    threads = record.get("threads") or ()
    frames = (main_thread(record) or (threads[0] if threads else {})).get("frames") or ()
    if frames and is_user_frame(frames[0]):
        return True
    return any(in_own_code(child) for child in record.get("children") or ())


def is_main(thread: dict) -> bool:
    """Whether a record's thread is its process's main thread: as the agent marks it
    ("main", whatever the thread's name), else by its name (a record that marks none)."""
    main = thread.get("main")
    return main if isinstance(main, bool) else thread.get("name") == "MainThread"


def main_thread(record: dict) -> dict | None:
    """A record's main thread; None where it names none (no stack)."""
    return next((t for t in record.get("threads") or () if is_main(t)), None)


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
        lines += children_lines(group.record)
    return lines


def children_lines(record: dict) -> list[str]:
    """A line per kind of child process of the rank (alike ones folded, as ranks are: by
    name and stack), those in the user's code first, up to CHILDREN_SHOWN; each with its
    main thread (else its first)."""
    alike: dict[tuple, list[dict]] = {}
    for child in record.get("children") or ():
        alike.setdefault(child_key(child), []).append(child)
    kinds = sorted(alike.values(), key=lambda kind: not in_own_code(kind[0]))
    left = sum(map(len, kinds[CHILDREN_SHOWN:])) + (record.get("children_left") or 0)
    lines = []
    for kind in kinds[:CHILDREN_SHOWN]:
        child = kind[0]
        who = f"{len(kind)} child processes" if len(kind) > 1 else "child process"
        who += f" {child.get('name') or '?'}"
        threads = [t for t in child.get("threads") or () if t.get("frames")]
        thread = next((t for t in threads if is_main(t)), threads[0] if threads else None)
        if child.get("error"):
            lines.append(f"    {who}: no stack: {child['error']}")
        elif thread is None:
            lines.append(f"    {who}: no Python thread")
        else:
            lines.append(f"    {who}: main thread in {thread_text(thread['frames'])}")
    if left:
        lines.append(f"    and {left} other child process{'es' if left != 1 else ''}")
    return lines


def moved(first: dict, second: dict, interval_s: float, clk_tck: int) -> bool:
    """Whether a rank moved between two records taken `interval_s` apart: its main thread
    did (`main_moved`), or the main thread of a child process of its own seen in both (a
    DataLoader worker that reads and decodes while the main thread waits for its batch), by
    the same rule. A child seen in one record only (started or ended between) says nothing:
    a rank whose main thread is stuck may still start tools."""
    if main_moved(first, second, interval_s, clk_tck):
        return True
    before = {child.get("pid"): child for child in first.get("children") or ()}
    return any(
        main_moved(before[child.get("pid")], child, interval_s, clk_tck)
        for child in second.get("children") or ()
        if child.get("pid") in before
    )


def main_moved(first: dict, second: dict, interval_s: float, clk_tck: int) -> bool:
    """Whether a process's main thread moved between two records taken `interval_s` apart:
    it did where

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
