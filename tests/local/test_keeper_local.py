"""The node agent as the SLURM batch script runs it (orchestrator.agent.keeper), started here
as the node's interpreter with nobody connected, then dialled by a controller that comes
late; seconds of real waiting (the stream's pure parts are tests/unit/agent/test_keeper.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.agent import BOOTSTRAP
from orchestrator.agent.bootstrap import slurm_bundle
from orchestrator.agent.relay import DIAL, socket_path
from orchestrator.agent.task_warning import stopped_file
from orchestrator.backends.sessions import FrameParser


def test_the_agent_runs_alone_and_a_controller_that_comes_late_gets_it_all(tmp_path: Path) -> None:
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
        dial = subprocess.Popen(
            [sys.executable, "-I", "-S", "-u", "-c", DIAL, path, "0", "10"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        dial.stdin.write(b"stacks 1 signal\n")  # a command reaches the agent
        dial.stdin.flush()
        time.sleep(1.0)
        with open(node_dir / "fifo", "w") as fifo:
            fifo.write("go\n")
        out = dial.stdout.read()  # to the end of the stream: stdin stays open (closed, the
        # dial leaves). The script ended 3 after the warning: its ranks stopped on it, which
        # is no failure of the node's, so srun's task ends 0 (srun's --kill-on-bad-exit
        # would end the step on nodes still saving) and the code is kept for the script.
        assert keeper.wait(timeout=30) == 0
        dial.stdin.close()
        dial.wait(timeout=10)
    finally:
        keeper.kill()
    head, _, frames = out.partition(b"\n")
    assert head == b"at 0 0"
    kinds = [kind for kind, _, _ in FrameParser().feed(frames)]
    assert kinds[0] == "S" and kinds[-1] == "X" and "K" in kinds, kinds
    parsed = FrameParser().feed(frames)
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
