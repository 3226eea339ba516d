"""`orchestrator clean`: remove the nodes' copies of ended runs (~/.orchestrator/runs/RUN),
on every node of a hostfile; never a run still running there (its agent holds a lock)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.backends.base import NodeConnection
from orchestrator.nodes.copies import REMOVE_TIME_LIMIT_S
from orchestrator.nodes.execute import last_line, run_on_nodes
from orchestrator.plan.launch_plan import NODE_RUNS_DIR
from orchestrator.sizes import human_bytes

# Run by the node's python: argv[1] the minimum age in seconds, argv[2] "1" for a dry run.
# A run's directory is ended when no agent holds the lock of any node directory in it; its
# age is that of the newest file in it. Homes shared by several nodes are common, so every
# step allows for another node cleaning the same directory at the same time: a run is first
# renamed away (one node wins), then removed. One line per run: WHAT RUN_ID BYTES.
CLEAN_NODE = r"""
import fcntl, os, shutil, sys, time
root = os.path.join(os.path.expanduser("~"), RUNS)
older, dry = float(sys.argv[1]), sys.argv[2] == "1"

def survey(path):
    size, newest, active = 0, os.lstat(path).st_mtime, False
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                stat = os.lstat(os.path.join(folder, name))
                size, newest = size + stat.st_size, max(newest, stat.st_mtime)
                if name == ".agent.lock":
                    with open(os.path.join(folder, name)) as lock:
                        try:
                            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        except BlockingIOError:
                            active = True
            except FileNotFoundError:
                pass
    return size, newest, active

try:
    runs = sorted(os.listdir(root))
except FileNotFoundError:
    runs = []
for run in runs:
    path = os.path.join(root, run)
    if ".removing-" in run or os.path.islink(path) or not os.path.isdir(path):
        continue
    try:
        size, newest, active = survey(path)
    except FileNotFoundError:
        continue  # another node with this home took it
    if active:
        print("running", run, size)
    elif older > 0 and time.time() - newest < older:
        print("recent", run, size)
    elif dry:
        print("would-remove", run, size)
    else:
        doomed = f"{path}.removing-{os.getpid()}"
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        print("failed" if os.path.exists(doomed) else "removed", run, size)
"""


@dataclass(frozen=True)
class RunCopy:
    host: str
    action: str  # removed, would-remove, running, recent, failed
    run_id: str
    size: int


def clean_nodes(
    connections: Sequence[NodeConnection],
    pythons: Sequence[str],
    older_than: float,
    dry_run: bool,
) -> tuple[list[RunCopy], list[str]]:
    """On every node: remove the copies of ended runs at least `older_than` seconds old.
    Returns what each node found, and the nodes where it could not look, as 'host: why'."""
    code = f"RUNS = {NODE_RUNS_DIR!r}\n" + CLEAN_NODE
    results = run_on_nodes(
        connections,
        pythons,
        [[python, "-c", code, repr(older_than), "1" if dry_run else "0"] for python in pythons],
        time_limit=REMOVE_TIME_LIMIT_S,
        tag="clean",
        what="orchestrator clean",
    )
    found, failed = [], []
    for result in results:
        if not result.ok:
            failed.append(f"{result.host}: {result.describe()}{last_line(result)}")
            continue
        for line in result.output.splitlines():
            words = line.split()
            if len(words) == 3 and words[2].isdigit():
                found.append(RunCopy(result.host, words[0], words[1], int(words[2])))
    return found, failed


def clean_table(found: Sequence[RunCopy], failed: Sequence[str], dry_run: bool) -> str:
    """What `orchestrator clean` did, per node and run, and a total."""
    lines = [f"{c.host}  {c.run_id}  {human_bytes(c.size)}  {describe(c.action)}" for c in found]
    gone = [c for c in found if c.action in ("removed", "would-remove")]
    verb = "would remove" if dry_run else "removed"
    lines.append(
        f"{verb} {len(gone)} node cop{'y' if len(gone) == 1 else 'ies'}, "
        f"{human_bytes(sum(c.size for c in gone))}"
    )
    lines += [f"could not clean {why}" for why in failed]
    return "\n".join(lines)


def describe(action: str) -> str:
    return {
        "removed": "removed",
        "would-remove": "would be removed",
        "running": "kept: the run is still running there",
        "recent": "kept: newer than --older-than",
        "failed": "could not be removed",
    }.get(action, action)


AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
AGE_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text: str) -> float:
    """'7d', '12h', '30m', '90s', '0' -> seconds. ValueError if unreadable."""
    match = AGE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not an age; write e.g. 7d, 12h, 30m or 0")
    return float(match.group(1)) * AGE_UNITS[match.group(2)]
