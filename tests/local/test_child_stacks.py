"""A rank's child processes' stacks, taken on the node (orchestrator.agent.stacks,
child_stacks.py) from a real process whose DataLoader worker blocks in a read of a named
pipe nobody writes: py-spy and the signal alike read the worker (forked: through the hook it
inherited from the rank) in the user's Dataset, and the folded stacks show the main thread's
line in the loop with the worker's frame under it; a child that is not Python is named."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.agent.stacks import hook_environment, take_stacks
from orchestrator.supervise.stack_groups import fold, render_groups
from tests.local.test_agent_stacks import HOOK, TIMEOUT, py_spy_path

LOADER = """\
import os, subprocess, sys, torch
class PipeDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, index):
        with open(sys.argv[1], "rb") as pipe:
            return torch.tensor(len(pipe.read()))
tool = subprocess.Popen(["sleep", "600"])
for batch in torch.utils.data.DataLoader(PipeDataset(), num_workers=1):
    print(batch)
"""


def test_the_worker_stuck_in_a_read_is_read_both_ways(tmp_path: Path) -> None:
    script, hook_dir, fifo = tmp_path / "loader.py", tmp_path / "stacks", tmp_path / "fifo"
    script.write_text(LOADER)
    os.mkfifo(fifo)
    env = hook_environment(dict(os.environ), HOOK, str(hook_dir))
    rank = subprocess.Popen([sys.executable, str(script), str(fifo)], env=env)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(take_stacks({0: rank.pid}, str(hook_dir), None, TIMEOUT)[0]["children"]) < 2:
            assert time.monotonic() < deadline, "no worker after 60 s"
            time.sleep(0.2)
        time.sleep(1)  # the worker reaches its read
        for way, py_spy in {"signal": None, "py-spy": py_spy_path()}.items():
            if way == "py-spy" and py_spy is None:
                continue  # not installed (tests/local/test_agent_stacks.py says so)
            record = take_stacks({0: rank.pid}, str(hook_dir), py_spy, TIMEOUT)[0]
            children = [c["pid"] for c in record["children"]]
            assert record["method"] == way, record
            tool, worker = sorted(record["children"], key=lambda c: c["name"] != "sleep")
            assert tool["error"] == "not Python (sleep)" and tool["parent"] == rank.pid
            assert worker["name"] == "pt_data_worker" and worker["method"] == way, worker
            (main,) = [t for t in worker["threads"] if t["main"]]
            assert main["frames"][0]["file"] == str(script), main["frames"][:2]
            assert main["frames"][0]["line"] == 6, main["frames"][:2]
            lines = render_groups(fold([record], {0: "localhost"}))
            print(way, *lines, sep="\n")
            assert lines[0].startswith("[localhost r0] 1 rank: main thread in ")
            assert "dataloader.py:" in lines[0] and "<- <module> (loader.py:9)" in lines[0]
            assert "; innermost " in lines[0] and "selectors.py:" in lines[0]
            assert any(
                line.startswith("    child process pt_data_worker: main thread in ")
                and "__getitem__ (loader.py:6)" in line
                for line in lines
            ), lines
            assert "    child process sleep: no stack: not Python (sleep)" in lines
    finally:
        for pid in children:  # by the pids they had: not orphaned once the rank is gone
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        rank.kill()
        rank.wait()
