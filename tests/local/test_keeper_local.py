"""The node agent as the SLURM batch script runs it (orchestrator.agent.keeper), started here
as the node's interpreter with nobody connected, then dialled by a controller that comes
late; seconds of real waiting (the stream's pure parts are tests/unit/agent/test_keeper.py)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.agent import BOOTSTRAP
from orchestrator.agent.bootstrap import slurm_bundle
from orchestrator.agent.relay import socket_path
from orchestrator.agent.task_warning import stopped_file
from orchestrator.backends.sessions import Event
from orchestrator.slurm.following.agents import AllocationStep, leave_steps
from tests.lab.local_srun import on_path


def test_the_agent_runs_alone_and_a_controller_that_comes_late_gets_it_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{on_path(tmp_path / 'bin')}:{os.environ['PATH']}")
    job_dir = tmp_path / "job"
    env = {
        **os.environ,
        "SLURM_JOB_ID": f"9{os.getpid()}",
        "SLURM_NODEID": "0",
        "SLURM_RESTART_COUNT": "0",
        "ORCHESTRATOR_JOB_DIR": str(job_dir),
    }
    script = (
        'echo started; echo hello > "$ORCHESTRATOR_NODE_DIR/rank-0.out"; '
        'read -t 60 line < "$ORCHESTRATOR_NODE_DIR/fifo"; '
        'echo "0 $(date +%s)" > "$ORCHESTRATOR_NODE_DIR/rank-0.exit"; echo done; exit 3'
    )
    config = {"argv": ["bash", "-c", script], "nproc": 1, "grace": 1.0}  # node 0: rank 0
    node_dir = job_dir / "attempt0" / "node0"
    node_dir.mkdir(parents=True)
    os.mkfifo(node_dir / "fifo")
    keeper = subprocess.Popen(
        [sys.executable, "-I", "-S", "-u", "-c", BOOTSTRAP, "orchestrator-agent", "t"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    keeper.stdin.write(slurm_bundle(config))
    keeper.stdin.close()
    path = socket_path(env["SLURM_JOB_ID"], 0, 0)
    try:
        time.sleep(1.5)  # the agent runs with nobody connected; what it says is kept
        keeper.send_signal(signal.SIGUSR1)  # the time limit's, as srun passes it on
        # The controller's one step over the allocation, srun here this machine's stand-in.
        events: queue.Queue[Event] = queue.Queue()
        step = AllocationStep(int(env["SLURM_JOB_ID"]), 0, {0: "n0"}, sys.executable, events, {})
        step.sessions[0].send("stacks 1 signal")  # a command reaches the agent
        time.sleep(1.0)
        with open(node_dir / "fifo", "w") as fifo:
            fifo.write("go\n")
        parsed = []  # to the end of the stream, its X: the step stays open (closed, the
        # dial leaves). The script ended 3 after the warning: its ranks stopped on it, which
        # is no failure of the node's, so srun's task ends 0 (srun's --kill-on-bad-exit
        # would end the step on nodes still saving) and the code is kept for the script.
        while not parsed or parsed[-1][0] != "X":
            event = events.get(timeout=30)
            parsed.append((event.kind, event.fields, event.data))
        assert keeper.wait(timeout=30) == 0
        leave_steps([step])
    finally:
        keeper.kill()
    assert (step.sessions[0].channel.start, step.sessions[0].channel.lost) == (0, 0)
    kinds = [kind for kind, _, _ in parsed]
    assert kinds[0] == "S" and kinds[-1] == "X" and "K" in kinds, kinds
    output = b"".join(data for kind, _, data in parsed if kind == "N")
    assert output == b"started\ndone\n"
    assert [fields for kind, fields, _ in parsed if kind == "X"][0][0] == "3"
    # The node's rank ships as over SSH: its lines, then its exit; and the signal is told.
    assert [data for kind, fields, data in parsed if kind == "O"] == [b"hello\n"]
    assert [fields[:2] for kind, fields, _ in parsed if kind == "E"] == [("0", "0")]
    (warned,) = [fields for kind, fields, _ in parsed if kind == "G"]
    assert warned[0] == "USR1" and warned[2:] == ("-", "-")
    assert not os.path.exists(path)  # the socket goes with the agent
    assert Path(stopped_file(path)).read_text() == "3\n"
    os.unlink(stopped_file(path))
    assert keeper.stdout.read() == b""  # with a job folder, nothing for SLURM's output file
