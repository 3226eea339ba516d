"""The stacks of a rank's own child processes (DataLoader workers, a pool, a tool it runs).

A rank that waits on a process of its own (its main thread in a DataLoader's `next`, a
`subprocess.run`, a pool's `get`) is stuck where that process is: the worker's read in the
user's `Dataset.__getitem__`, not the main thread's wait on a pipe. So each rank's record
carries its descendants' records, found from /proc (the children files the agent already
walks, see orchestrator.agent.processes), each read the way a rank is (py-spy, else the
signal) in a thread of its own, after the rank's own stack:

    "children": [{"pid": 5963, "parent": 5960, "name": "pt_data_worker",
                  "method": "py-spy" | "signal" | None, "threads": [...],
                  "taken_at": ..., "pause_s": ..., "main_cpu_ticks": ...,
                  "main_cpu_wanted_ns": ..., "main_wakeups": ..., "error": None | "..."}],
    "children_left": 0

"name" is the process's own (/proc/PID/comm: torch names its workers `pt_data_worker`);
a child that is not Python is named and not read ("error" says so). At most
CHILDREN_TAKEN are read, the lowest pids (the oldest: a DataLoader's workers before what
they start); "children_left" counts the rest.

py-spy's own `--subprocesses` does not fit: with `--json` (py-spy 0.4.3) it prints the
parent's threads only. One `py-spy dump` per child costs about 20 ms of wall time and
15 ms of CPU, the same as a rank's.

A child forked from a rank (a DataLoader worker under the fork start method, Linux's
default before Python 3.14) has no hook of its own (it never ran site.py), but it inherited
the rank's: faulthandler's registration and the rank's dump file, open at the descriptor
the ready file names. Such a child is signalled only where it still holds that very file
there (the same inode: a descriptor opened with O_CLOEXEC, so an exec since would have
closed it) and catches the signal; its dump is appended to the rank's file
(orchestrator.agent.stacks.dump_with_hook). A child that started an interpreter of its own
(spawn, forkserver) ran the hook itself and announced itself.

Standard library only: this module runs on the nodes too.
"""

from __future__ import annotations

import os

from orchestrator.agent.processes import descendants_of, stat_fields
from orchestrator.agent.ranks import is_python

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

CHILDREN_TAKEN = 8  # per rank; a DataLoader's usual num_workers


def children_of_rank(pid: int) -> tuple[list[int], int]:
    """(the descendants of a rank to read, lowest pids first; how many more there are)."""
    found = sorted(descendants_of(pid))
    return found[:CHILDREN_TAKEN], max(0, len(found) - CHILDREN_TAKEN)


def process_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def parent_of(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[1]) if fields and fields[1].isdigit() else None


def child_record(pid: int, take: Callable[[int], dict]) -> dict:
    """One child's record: `take(pid)` (a rank's record, less its rank) where it runs
    Python, else why not, named either way."""
    name = process_name(pid)
    if is_python(pid):
        record = take(pid)
    else:
        record = {"pid": pid, "method": None, "threads": [], "error": f"not Python ({name})"}
    record.pop("rank", None)
    return {"pid": pid, "parent": parent_of(pid), "name": name, **record}


def holds_same_file(pid: int, fd: int, path: str) -> bool:
    """Whether process `pid` holds `path` open at descriptor `fd` (the same inode)."""
    try:
        held, wanted = os.stat(f"/proc/{pid}/fd/{fd}"), os.stat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (wanted.st_dev, wanted.st_ino)
