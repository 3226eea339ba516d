"""The nodes' copies of runs (orchestrator.nodes.copies): the node-side clean script run here on a
home of its own, with a real lock held as an agent holds it, and the pure parts. The copies
on the namespace nodes, removed by a launch and by `orchestrator clean`, are in
test_disk_cluster.py."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.hostlist import expand_range
from orchestrator.nodes.clean import CLEAN_NODE, RunCopy, clean_table, parse_age
from orchestrator.nodes.copies import by_reason, copy_path
from orchestrator.plan.launch_plan import NODE_RUNS_DIR, node_dir


def clean_here(home: Path, older: float, dry: bool) -> list[list[str]]:
    code = f"RUNS = {NODE_RUNS_DIR!r}\n" + CLEAN_NODE
    done = subprocess.run(
        [sys.executable, "-c", code, repr(older), "1" if dry else "0"],
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        check=True,
    )
    return [line.split() for line in done.stdout.splitlines()]


def make_run(home: Path, run_id: str, age: float = 0.0) -> Path:
    node = home / NODE_RUNS_DIR / run_id / "node0"
    node.mkdir(parents=True)
    (node / "rank-0.out").write_text("hello\n")
    (node / ".agent.lock").write_text("")
    then = time.time() - age
    for path in (node / "rank-0.out", node / ".agent.lock", node, node.parent):
        os.utime(path, (then, then))
    return node


def test_clean_removes_ended_runs_and_never_a_running_one(tmp_path: Path) -> None:
    make_run(tmp_path, "ended")
    make_run(tmp_path, "old", age=3 * 86400)
    running = make_run(tmp_path, "running")
    with open(running / ".agent.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the run's agent holds it
        assert clean_here(tmp_path, 0, dry=True) == [
            ["would-remove", "ended", "6"],
            ["would-remove", "old", "6"],
            ["running", "running", "6"],
        ]
        assert clean_here(tmp_path, 86400, dry=False) == [
            ["recent", "ended", "6"],
            ["removed", "old", "6"],
            ["running", "running", "6"],
        ]
        assert clean_here(tmp_path, 0, dry=False)[0] == ["removed", "ended", "6"]
    assert sorted(p.name for p in (tmp_path / NODE_RUNS_DIR).iterdir()) == ["running"]


def test_clean_on_a_node_that_never_ran_anything(tmp_path: Path) -> None:
    assert clean_here(tmp_path, 0, dry=False) == []


def test_a_node_copy_is_named_relative_to_the_home() -> None:
    assert copy_path(node_dir("r1", 2)) == ".orchestrator/runs/r1/node2"


@pytest.mark.parametrize(
    ("text", "seconds"), [("0", 0), ("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800)]
)
def test_ages(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-1d", "7w", ""])
def test_unreadable_ages_say_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="write e.g. 7d, 12h, 30m or 0"):
        parse_age(text)


def test_the_clean_table_totals_what_went() -> None:
    found = [
        RunCopy("n0", "removed", "a", 2048),
        RunCopy("n0", "running", "b", 10),
        RunCopy("n1", "removed", "a2", 1024),
    ]
    table = clean_table(found, ["n2: lost: no answer"], dry_run=False).splitlines()
    assert table[1] == "n0  b  10B  kept: the run is still running there"
    assert table[-2] == "removed 2 node copies, 3.0K"
    assert table[-1] == "could not clean n2: lost: no answer"


def test_copies_not_removed_are_told_once_per_reason_with_a_host_list() -> None:
    # Seen at 256 nodes: 211 nodes failed for one reason and 7 for another; 218 warnings.
    late = "lost: its agent did not report back after the stop (the node answers)"
    cut = "time limit reached (signal SIGTERM)"
    failed = [(f"n{i}", cut if i in (29, 41) else late) for i in range(256) if i % 5]
    (hosts, why), other = by_reason(failed)
    assert why == late and hosts.startswith("n[1-4,6-9,11-14,16-19,21-24,26-28,31-34,"), hosts
    assert expand_range(hosts) == [host for host, reason in failed if reason == late]
    assert other == ("n[29,41]", cut)
    assert by_reason([("b", late), ("a", late)]) == [("b,a", late)]
    assert by_reason([]) == []
