"""orchestrator.check.reach, the small program the check ships to nodes, run here as
processes of its own on loopback: a listener that hears every node, a refused connection
and a busy port, each waiting out the program's own timeouts (the check's pure parts are
tests/unit/check/test_check.py)."""

from __future__ import annotations

import socket
import subprocess
import sys

from orchestrator.nodes.paths.prove import reach_source
from tests.factories import free_port


def reach(*args: str, timeout: float = 30) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", reach_source(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


def test_reach_listener_hears_every_node() -> None:
    port = free_port()
    common = ["--host", "127.0.0.1", "--port", str(port), "--token", "t0k", "--timeout", "5"]
    listener = subprocess.Popen(
        [
            sys.executable,
            "-c",
            reach_source(),
            *common,
            "--node",
            "0",
            "--listen",
            "2",
            "--source",
            "127.0.0.1",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    other = reach(*common, "--node", "1")  # retries until the listener is up
    out, _ = listener.communicate(timeout=30)
    master = dict(line.split("=", 1) for line in out.splitlines())
    assert other["reach"] == "ok" and float(other["reach_ms"]) >= 0
    assert master == {**master, "listen": "ok", "reach": "ok", "heard": "0,1"}


def test_reach_reports_refused_and_a_busy_port() -> None:
    port = free_port()
    refused = reach(
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--token",
        "x",
        "--node",
        "1",
        "--timeout",
        "0.5",
        "--sshd-port",
        str(port),
    )
    assert refused["reach"] == "error" and refused["reach_error"].startswith("ECONNREFUSED")
    assert refused["sshd_port"].startswith("ECONNREFUSED")
    with socket.create_server(("127.0.0.1", port)):
        wrong = reach(
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--token",
            "x",
            "--node",
            "0",
            "--timeout",
            "1",
            "--listen",
            "1",
        )
    assert wrong["listen_error"].startswith("EADDRINUSE")
    assert wrong["reach"] == "error"
