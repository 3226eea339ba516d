"""`srun` for one step over "nodes" that are this machine: what the launcher's step over the
allocation (orchestrator.slurm.following.agents) needs of srun, and nothing else of it.

    python -m tests.lab.local_srun --nodelist=HOSTS [--other-option ...] COMMAND ...

Each host of --nodelist gets one task: COMMAND with SLURMD_NODENAME=HOST in its environment,
as slurmd starts it. The whole of this process's stdin goes to every task (srun's
--input=all), and the tasks' stdout comes out merged by whole lines, as srun's does without
--unbuffered; their stderr goes to this one's. It ends when every task has. Used where the
launcher's side is tested without SLURM (`on_path` puts it first on PATH as `srun`); the
same code against real SLURM runs in the tests/cluster SLURM tests.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

from orchestrator.hostlist import expand_range


def main(argv: list[str]) -> int:
    hosts: list[str] = []
    while argv and argv[0].startswith("-"):
        option = argv.pop(0)
        if option.startswith("--nodelist="):
            hosts = expand_range(option.split("=", 1)[1])
    tasks = [
        subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "SLURMD_NODENAME": host},
        )
        for host in hosts
    ]
    lock = threading.Lock()

    def carry(task: subprocess.Popen[bytes]) -> None:
        for line in task.stdout:  # type: ignore[union-attr]
            with lock:
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()

    readers = [threading.Thread(target=carry, args=(task,), daemon=True) for task in tasks]
    for reader in readers:
        reader.start()
    threading.Thread(target=broadcast, args=(tasks,), daemon=True).start()
    codes = [task.wait() for task in tasks]
    for reader in readers:
        reader.join()
    return max(codes, default=0)


def broadcast(tasks: list[subprocess.Popen[bytes]]) -> None:
    while data := os.read(0, 1 << 16):
        for task in tasks:
            try:
                task.stdin.write(data)  # type: ignore[union-attr]
                task.stdin.flush()  # type: ignore[union-attr]
            except (BrokenPipeError, ValueError):
                pass
    for task in tasks:
        try:
            task.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass


def on_path(folder: Path) -> str:
    """A folder holding `srun`, this stand-in, to put first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    srun = folder / "srun"
    root = Path(__file__).resolve().parents[2]
    srun.write_text(
        f'#!/bin/sh\nPYTHONPATH="{root}${{PYTHONPATH:+:$PYTHONPATH}}" '
        f'exec "{sys.executable}" -m tests.lab.local_srun "$@"\n'
    )
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    return str(folder)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
