"""Stops as a user sees them, on the namespace cluster: a stop at 16 nodes is one line per node
on the console (torchrun's shutdown tracebacks stay in the node logs), and a controller whose
terminal goes away (SIGHUP) stops the run and leaves a final record. Each test ends by looking
at the process table."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import termios
import textwrap
import threading
from pathlib import Path

import pytest

from orchestrator.hostlist import expand_range
from tests.cli_helpers import (
    ORCHESTRATOR,
    assert_nothing_left,
    start_cli,
    status_of,
    wait_ready,
)

pytestmark = pytest.mark.cluster

SLEEPER = textwrap.dedent("""
    import os, time
    print(f"rank {os.environ['RANK']} ready", flush=True)
    time.sleep(600)
""")


def launch_argv(hostfile: Path, runs: Path, run_id: str) -> list[str]:
    return [
        "launch", str(hostfile), "--run-dir", str(runs), "--run-id", run_id,
        "--color", "never", "--grace", "5", "--", "sleeper.py",
    ]  # fmt: skip


def test_a_stop_at_16_nodes_keeps_torchruns_tracebacks_off_the_console(
    make_cluster, tmp_path: Path
) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    runs, run_id = tmp_path / "runs", "quiet-stop"
    with make_cluster(16) as cluster:
        hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=1)
        proc = start_cli(launch_argv(hostfile, runs, run_id), cwd=tmp_path, env=cluster.environ())
        try:
            wait_ready(runs, run_id, 16, proc)
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 143, out
        assert_nothing_left(run_id)
    assert "Traceback" not in out and "death signal" not in out, out
    stopping = [line for line in out.splitlines() if ": stopping (stop requested)" in line]
    # each node says what was stopped; the console folds the nodes that say the same
    named = [
        host
        for line in stopping
        for host in expand_range(line.split("] ", 1)[1].split(": stopping", 1)[0])
    ]
    assert sorted(named) == sorted(node.name for node in cluster.nodes), out
    assert len(stopping) <= 4, out
    node_logs = [(runs / run_id / "logs" / f"node-{k}.log") for k in range(16)]
    kept = [p for p in node_logs if p.exists() and b"death signal" in p.read_bytes()]
    assert kept, "torchrun's shutdown output is in no node log"
    combined = (runs / run_id / "logs" / "combined.log").read_bytes()
    assert b"death signal" in combined
    status = status_of(runs, run_id)
    assert status["state"] == "stopped" and status["summary"] == "stopped by SIGTERM", status


def test_a_closed_terminal_stops_the_run_and_leaves_a_final_record(cluster, tmp_path: Path) -> None:
    """The controller runs on a terminal of its own (a pty, its controlling terminal); the
    terminal goes away as when an ssh session to a login node drops: SIGHUP, and every later
    write to it fails."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    runs, run_id = tmp_path / "runs", "hangup"
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=1)
    master, slave = os.openpty()

    def own_terminal() -> None:  # after setsid: the pty becomes the controlling terminal
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        [*ORCHESTRATOR, *launch_argv(hostfile, runs, run_id)],
        cwd=tmp_path,
        env=cluster.environ(),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=own_terminal,
    )
    os.close(slave)
    seen: list[bytes] = []
    hang_up = threading.Event()

    def read() -> None:  # the terminal shows what it is sent, until it goes away
        while not hang_up.is_set():
            if select.select([master], [], [], 0.2)[0]:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:
                    return
                seen.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_ready(runs, run_id, len(cluster.nodes), proc)
        hang_up.set()
        reader.join()
        os.close(master)  # the last holder of the terminal's master side: a hangup
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 129, b"".join(seen).decode(errors="replace")
    status = status_of(runs, run_id)
    assert status["state"] == "stopped" and status["exit_code"] == 129, status
    assert status["summary"] == "stopped by SIGHUP", status
    assert status["ended_at"], status
    assert all(n["state"] == "stopped" for n in status["nodes"]), status
    assert all(r["state"] in ("stopped", "killed") for r in status["ranks"]), status
    combined = (runs / run_id / "logs" / "combined.log").read_text()
    assert "SIGHUP: stopping the run on every node" in combined
    assert f"run {run_id} stopped (exit code 129)" in combined
    assert_nothing_left(run_id)
