"""Nodes that share their identical memory pages (the kernel's same-page merging, KSM).

On a real cluster each node imports torch into memory of its own; in the lab every node
lives on one machine, and each process that imports torch keeps ~144 MB of private pages
(relocated library data, the interpreter's objects): 256 torchruns need 37 GB, on 24 GB
here. Those pages are the same in every node's torchrun but for two randomisations: where
libraries are loaded (ASLR) and Python's string hashes. With both off in the nodes
(`setarch -R`, and PYTHONHASHSEED=0 through sshd's SetEnv) and the nodes' processes marked
mergeable (prctl PR_SET_MEMORY_MERGE, kept across fork and exec, so by everything an sshd
starts), the kernel's merging thread keeps one copy. Measured here with 10 processes that
import torch: 1 456 MB without, 195 MB with (ASLR off alone: 900 MB; the hash seed alone:
no change). The benchmarks at scale use it (as they use cgroups.py); the tests do not.

ksmd's settings are machine-wide: `start` sets them and returns the old ones, which the
cluster's state keeps so that its teardown, or a later stale-cluster sweep, puts them back.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from pathlib import Path

KSM = Path("/sys/kernel/mm/ksm")
PR_SET_MEMORY_MERGE = 67
HASH_SEED = "PYTHONHASHSEED=0"
# Fast enough to keep up with 256 torch imports started within minutes (~4 GB/s at most),
# and ksmd first in line for the CPU: at 5 000 pages and its own nice 5, ksmd got 3 % of a
# core among 256 starting nodes, merged 3 GB of 37 and the nodes swapped; at these it used
# about half a core and kept them near 10 GB.
SETTINGS = {"pages_to_scan": "20000", "sleep_millisecs": "20", "run": "1"}
KSMD_NICE = -20

_MARK = (
    "import ctypes, os, sys\n"
    f"if ctypes.CDLL(None, use_errno=True).prctl({PR_SET_MEMORY_MERGE}, 1, 0, 0, 0) != 0:\n"
    "    sys.exit('prctl(PR_SET_MEMORY_MERGE): ' + os.strerror(ctypes.get_errno()))\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


class Unavailable(Exception):
    """This machine cannot merge the nodes' pages (the message says why)."""


def start() -> dict[str, str]:
    """Turn ksmd on with SETTINGS; returns the settings it had, for `restore`."""
    if not (KSM / "run").exists():
        raise Unavailable(f"this kernel has no same-page merging ({KSM} is missing)")
    try:
        pid = _ksmd()
        previous = running(pid)
        for name, value in SETTINGS.items():
            (KSM / name).write_text(value + "\n")
        if pid is not None:
            os.setpriority(os.PRIO_PROCESS, pid, KSMD_NICE)
    except OSError as exc:
        raise Unavailable(f"cannot set up same-page merging: {exc}") from None
    return previous


def _ksmd() -> int | None:
    """The pid of the kernel's merging thread, or None."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "ksmd":
                return int(entry.name)
    return None


def running(pid: int | None = None) -> dict[str, str]:
    """ksmd's SETTINGS (and its nice value) as they are now; `pid`: ksmd's, if known."""
    now = {name: (KSM / name).read_text().strip() for name in SETTINGS}
    pid = pid if pid is not None else _ksmd()
    if pid is not None:
        now["nice"] = str(os.getpriority(os.PRIO_PROCESS, pid))
    return now


def restore(previous: dict[str, str]) -> None:
    """Put back what `start` found (run last: 0 stops merging, pages already merged stay)."""
    pid = _ksmd()
    for name in sorted(previous, key=lambda name: name == "run"):
        with contextlib.suppress(OSError):
            if name != "nice":
                (KSM / name).write_text(previous[name] + "\n")
            elif pid is not None:
                os.setpriority(os.PRIO_PROCESS, pid, int(previous[name]))


@contextlib.contextmanager
def paused():
    """ksmd stopped while the block runs (`run` 0 keeps the pages merged so far), then
    running again as it was; nothing to do where it was not running. For measuring
    something else while the nodes sit idle: at 256 nodes ksmd's scanning took ~40 % of a
    core all the time."""
    was = (KSM / "run").read_text().strip() if (KSM / "run").exists() else "0"
    if was != "1":
        yield False
        return
    (KSM / "run").write_text("0\n")
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            (KSM / "run").write_text(was + "\n")


def mergeable(argv: list[str]) -> list[str]:
    """`argv` run with ASLR off and its memory (and its children's) marked mergeable; the
    wrapper execs, so the pid stays the command's."""
    return ["setarch", platform.machine(), "-R", sys.executable, "-c", _MARK, *argv]


def with_hash_seed(sshd_extra: str) -> str:
    """sshd config lines that also give every session PYTHONHASHSEED=0 (sshd takes only the
    first SetEnv line, so the seed joins an existing one)."""
    lines = sshd_extra.splitlines()
    for i, line in enumerate(lines):
        if line.split(None, 1)[:1] == ["SetEnv"]:
            lines[i] = f"{line.rstrip()} {HASH_SEED}"
            return "\n".join(lines)
    return "\n".join([*lines, f"SetEnv {HASH_SEED}"])


def merged_bytes() -> int:
    """Memory the merging saves right now (pages that point at another's copy)."""
    return int((KSM / "pages_sharing").read_text()) * os.sysconf("SC_PAGE_SIZE")
