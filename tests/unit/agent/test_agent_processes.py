"""The agent's process control (orchestrator.agent.processes), on real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.agent import processes
from orchestrator.agent.child_stacks import process_name
from orchestrator.agent.processes import (
    CHILDREN_FILES,
    ProcessTree,
    claim_node_dir,
    descendants_of,
    scanned_descendants_of,
    script_command,
    shell_level,
    state_of,
    tree_of,
)
from tests.factories import wait_for


def sleeping(tree: ProcessTree) -> int:
    """How many of the tree's processes run `sleep` (so the script got past its traps)."""
    return [process_name(pid) for pid in tree.descendants()].count("sleep")


def run_stop(tree: ProcessTree, timeout: float = 10.0) -> float:
    """Drive a stop as the agent's loop does, until nothing is left; returns the time taken."""
    start = time.monotonic()
    while tree.descendants() or tree.script_rc is None:
        assert time.monotonic() - start < timeout, f"still running: {tree.descendants()}"
        tree.reap()
        tree.enforce_stop(time.monotonic(), ranks_done=False)
        time.sleep(0.01)
    return time.monotonic() - start


@pytest.fixture
def tree():
    said: list[str] = []
    tree = ProcessTree(said.append)
    tree.said = said
    yield tree
    for pid in tree.descendants():  # whatever a failed test left
        os.kill(pid, signal.SIGKILL)
    tree.reap()
    if tree.proc is not None:
        tree.proc.stdout.close()


def start(tree: ProcessTree, shell: str, tmp_path: Path) -> subprocess.Popen:
    # Its output pipe stays open (bash reports a job killed by a signal there) and unread.
    return tree.start(["bash", "-c", shell], str(tmp_path), dict(os.environ))


def test_descendants_are_found_through_every_level_and_end_as_they_end(tree, tmp_path) -> None:
    proc = start(tree, "sleep 30 & bash -c 'sleep 30 & wait' & wait", tmp_path)
    wait_for(lambda: len(descendants_of(proc.pid)) == 3)  # sleep, bash and that bash's sleep
    assert set(descendants_of(proc.pid)) < set(tree.descendants())
    assert proc.pid in tree.descendants()
    tree.begin_stop(5, "test")
    run_stop(tree)
    assert descendants_of(proc.pid) == [] and tree.descendants() == []


def test_the_children_walk_finds_what_a_scan_of_proc_finds_and_skips_zombies(
    tree, tmp_path
) -> None:
    # The subshell starts `sleep 0`, then becomes `sleep 30`, which never reaps it.
    proc = start(tree, "(sleep 0 & exec sleep 30) & wait", tmp_path)
    wait_for(lambda: b"Z" in [state_of(pid) for pid in tree_of(proc.pid)])
    assert CHILDREN_FILES
    found = descendants_of(proc.pid)
    assert len(tree_of(proc.pid)) == 2 and len(found) == 1  # the zombie is not counted
    assert found == scanned_descendants_of(proc.pid) and state_of(found[0]) == b"S"
    tree.begin_stop(5, "test")
    run_stop(tree)


def test_a_stop_that_sigterm_ends_does_not_wait_for_the_grace(tree, tmp_path) -> None:
    start(tree, "sleep 30 & wait", tmp_path)
    wait_for(lambda: sleeping(tree) == 1)
    tree.begin_stop(30, "stop requested")
    assert run_stop(tree) < 5
    assert tree.script_rc == -signal.SIGTERM
    assert tree.said == ["stopping (stop requested): SIGTERM to 2 process(es), SIGKILL after 30 s"]


def test_what_ignores_sigterm_gets_sigkill_after_the_grace(tree, tmp_path) -> None:
    start(tree, "trap '' TERM; sleep 30 & wait; wait", tmp_path)
    wait_for(lambda: sleeping(tree) == 1)
    tree.begin_stop(0.5, "test")
    took = run_stop(tree)
    assert 0.5 <= took < 5
    assert tree.killing and tree.said[-1].startswith("SIGKILL to ")
    assert tree.script_rc == -signal.SIGKILL


def test_a_shorter_grace_wins_and_a_longer_one_is_ignored(tree, tmp_path) -> None:
    start(tree, "trap '' TERM; exec sleep 30", tmp_path)
    wait_for(lambda: sleeping(tree) == 1)
    tree.begin_stop(30, "stop requested")
    first = tree.stop_deadline
    tree.begin_stop(60, "again")
    assert tree.stop_deadline == first
    tree.begin_stop(0, "kill requested")
    assert tree.stop_deadline < first
    assert run_stop(tree) < 5
    assert len([s for s in tree.said if s.startswith("stopping")]) == 1  # SIGTERM once


def test_a_stop_signals_each_process_once_its_group_or_itself(tree, tmp_path, monkeypatch) -> None:
    # torchrun is in the script's group: a second SIGTERM of its own, sent after the
    # group's, would reach it while it stops its workers and cut that short. What left
    # the group (setsid) is reached on its own.
    sent: list[tuple[str, int]] = []
    real_pid, real_group = processes.signal_pid, processes.signal_group
    monkeypatch.setattr(
        processes, "signal_pid", lambda pid, sig: (sent.append(("pid", pid)), real_pid(pid, sig))
    )
    monkeypatch.setattr(
        processes,
        "signal_group",
        lambda pgid, sig: (sent.append(("group", pgid)), real_group(pgid, sig)),
    )
    proc = start(tree, "sleep 30 & setsid sleep 30 & wait", tmp_path)
    # Its own: not what other tests may have left to this process.
    wait_for(lambda: [process_name(pid) for pid in descendants_of(proc.pid)] == ["sleep", "sleep"])
    mine = {proc.pid, *descendants_of(proc.pid)}
    alone = [pid for pid in mine if os.getpgid(pid) != proc.pid]
    assert len(alone) == 1
    tree.begin_stop(30, "test")
    assert [to for to in sent if to[0] == "group" or to[1] in mine] == [
        ("group", proc.pid),
        ("pid", alone[0]),
    ]
    assert run_stop(tree) < 5 and not tree.killing


def test_processes_started_during_a_stop_get_sigterm_too(tree, tmp_path) -> None:
    # The script outlives its SIGTERM (a trap) and starts a newcomer after the stop began.
    marker = tmp_path / "go"
    start(
        tree,
        f"trap true TERM; until [ -e {marker} ]; do sleep 0.05; done; sleep 30 & wait",
        tmp_path,
    )
    wait_for(lambda: sleeping(tree) == 1)
    tree.begin_stop(30, "test")
    before = set(tree.signalled)
    marker.touch()
    wait_for(lambda: set(tree.descendants()) - before)
    tree.enforce_stop(time.monotonic() + 1, ranks_done=False)  # past the scan interval
    assert tree.signalled - before
    assert run_stop(tree) < 5  # the newcomer ended on SIGTERM, and the script with it
    assert not tree.killing and tree.script_rc == 0


def test_when_every_rank_ended_the_script_is_not_waited_for(tree, tmp_path) -> None:
    start(tree, "trap '' TERM; exec sleep 30", tmp_path)
    wait_for(lambda: sleeping(tree) == 1)
    tree.begin_stop(30, "test")
    tree.enforce_stop(time.monotonic() + 1, ranks_done=True)
    wait_for(lambda: (tree.reap(), tree.script_rc)[1] is not None)
    assert tree.script_rc == -signal.SIGKILL


def test_script_command_writes_the_script_and_sets_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SHLVL", "0")
    config = {"script": "echo hi\n", "script_name": "node0.sh", "env": {"A": "1"}}
    argv, cwd, env = script_command(config, str(tmp_path))
    assert argv == ["bash", str(tmp_path / "node0.sh")] and cwd == str(tmp_path)
    assert (tmp_path / "node0.sh").read_text() == "echo hi\n"
    assert os.access(tmp_path / "node0.sh", os.X_OK)
    assert env["A"] == "1" and env["SHLVL"] == "1"
    assert env["ORCHESTRATOR_NODE_DIR"] == str(tmp_path)


def test_script_command_runs_a_command_in_home_without_a_node_dir(monkeypatch) -> None:
    monkeypatch.setenv("SHLVL", "3")
    argv, cwd, env = script_command({"argv": ["true"]}, None)
    assert argv == ["true"] and cwd == os.path.expanduser("~")
    assert env["SHLVL"] == "3" and "ORCHESTRATOR_NODE_DIR" not in env


@pytest.mark.parametrize(("value", "level"), [(None, 0), ("2", 2), ("x", 0), ("", 0)])
def test_shell_level(value, level) -> None:
    assert shell_level({} if value is None else {"SHLVL": value}) == level


def test_claiming_a_node_dir_clears_rank_files_and_refuses_a_second_holder(tmp_path) -> None:
    node_dir = tmp_path / "node0"
    node_dir.mkdir()
    (node_dir / "rank-0.out").write_text("old run\n")
    (node_dir / "rank-0.exit").write_text("0 1.0\n")
    (node_dir / "node0.sh").write_text("kept\n")
    lock = claim_node_dir(str(node_dir))
    try:
        assert sorted(p.name for p in node_dir.iterdir()) == [".agent.lock", "node0.sh"]
        with pytest.raises(OSError, match="another run with the same run id is active"):
            claim_node_dir(str(node_dir))
    finally:
        lock.close()
    claim_node_dir(str(node_dir)).close()  # free again once the holder let go
