"""Through a login node with stock sshd settings (OpenSSH's MaxStartups 10:30:100), on the
namespace cluster: 16 nodes behind one jump host (more than its MaxStartups and MaxSessions of
10) are all reached, every time, over one TCP connection to it; a handshake dropped by an sshd
past its MaxStartups is tried again; a refused key is not; no library output reaches the
console. The same at 64 to 250 nodes, and many rounds of launches, is
benchmarks/jump_host.py's: at 64 nodes here it cost six minutes of every run of the suite."""

from __future__ import annotations

import ipaddress
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_helpers import assert_nothing_left, run_cli
from tests.lab.cluster import Cluster
from tests.lab.fixtures import _remove_stale_once, _teardown, require_lab
from tests.lab.ssh import new_key

pytestmark = pytest.mark.cluster

BEHIND = 16  # past the jump host's stock limits (10); at scale: benchmarks/jump_host.py
EXEC_ROUNDS = 5
LAUNCH_ROUNDS = 1  # rounds at 64 nodes: benchmarks/jump_host.py --nodes 64 --launch-rounds 10
HELLO = "import os\nprint(f\"hello from rank {os.environ['RANK']}\", flush=True)\n"


@pytest.fixture(scope="module")
def jumped() -> Iterator[Cluster]:
    """Node 0 a jump host with stock limits; the ssh config sends the other nodes through it."""
    require_lab()
    _remove_stale_once()
    lab = Cluster.create(BEHIND + 1)
    try:
        jump = lab.nodes[0]
        lab.use_stock_limits(jump)
        behind = " ".join(node.name for node in lab.nodes[1:])
        lab.write_ssh_config(
            f"Host {behind}\n    ProxyJump {jump.name}\n"
            + lab.ssh.default_config(lab.nodes, lab.subnet_glob)
        )
        yield lab
    finally:
        _teardown(lab)


def sshd_settings(lab: Cluster, node_index: int) -> dict[str, str]:
    node = lab.nodes[node_index]
    done = lab.exec_in(node, ["/usr/sbin/sshd", "-T", "-f", str(node.sshd_config_path)])
    assert done.returncode == 0, done.stderr
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


class Connections:
    """Samples this namespace's established TCP connections to port 22 while a command runs:
    the most seen at once to the jump host, and whether any went to a node directly."""

    def __init__(self, lab: Cluster) -> None:
        self.jump = lab.nodes[0].address
        self.subnet = lab.subnet
        self.most_to_jump = 0
        self.direct: set[str] = set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done.is_set():
            shown = subprocess.run(
                ["ss", "-Htn", "state", "established", "dport", "=", "22"],
                capture_output=True,
                text=True,
            ).stdout
            peers = [line.split()[-1].rsplit(":", 1)[0] for line in shown.splitlines()]
            self.most_to_jump = max(self.most_to_jump, peers.count(self.jump))
            self.direct.update(
                p for p in peers if p != self.jump and ipaddress.ip_address(p) in self.subnet
            )
            time.sleep(0.05)

    def __enter__(self) -> Connections:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def no_library_output(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text and "Exception (client)" not in text, text


def test_the_jump_host_keeps_openssh_stock_limits(jumped: Cluster) -> None:
    settings = sshd_settings(jumped, 0)
    assert settings["maxstartups"] == "10:30:100" and settings["maxsessions"] == "10", settings
    assert sshd_settings(jumped, 1)["maxstartups"] == "1024:30:1024"


def test_exec_reaches_every_node_behind_the_jump_host_every_time(
    jumped: Cluster, tmp_path: Path
) -> None:
    hostfile = jumped.write_hostfile(tmp_path / "hosts.txt", jumped.nodes[1:])
    command = "echo reached from $(ip -4 -o addr show eth0 | awk '{print $4}'); sleep 0.5"
    for round_ in range(EXEC_ROUNDS):
        with Connections(jumped) as seen:
            done = run_cli(
                ["exec", str(hostfile), "--color", "never", "--no-fold", "--", command],
                cwd=tmp_path,
                env=jumped.environ(),
                timeout=300,
            )
        assert done.returncode == 0, (round_, done.stdout + done.stderr)
        for node in jumped.nodes[1:]:
            line = f"[{node.name}] reached from {node.cidr}"
            assert line in done.stdout.splitlines(), (round_, node.name, done.stdout)
        assert seen.most_to_jump == 1, (round_, seen.most_to_jump)
        assert not seen.direct, (round_, seen.direct)
        no_library_output(done.stdout, done.stderr)


def test_launch_reaches_every_node_behind_the_jump_host_every_time(
    jumped: Cluster, tmp_path: Path
) -> None:
    (tmp_path / "hello.py").write_text(HELLO)
    hostfile = jumped.write_hostfile(tmp_path / "hosts.txt", jumped.nodes[1:])
    for round_ in range(LAUNCH_ROUNDS):
        run_id = f"jump{round_}"
        with Connections(jumped) as seen:
            done = run_cli(
                [
                    "launch",
                    str(hostfile),
                    "--run-dir",
                    str(tmp_path / "runs"),
                    "--run-id",
                    run_id,
                    "--color",
                    "never",
                    "--no-preflight",
                    "--",
                    "hello.py",
                ],
                cwd=tmp_path,
                env=jumped.environ(),
                timeout=600,
            )
        assert done.returncode == 0, (round_, done.stdout[-3000:] + done.stderr[-3000:])
        logs = tmp_path / "runs" / run_id / "logs"
        for rank in range(BEHIND):
            said = (logs / f"rank-{rank}.log").read_text()
            assert f"hello from rank {rank}" in said, (round_, rank, said)
        assert seen.most_to_jump == 1, (round_, seen.most_to_jump)
        assert not seen.direct, (round_, seen.direct)
        no_library_output(done.stdout, done.stderr)
        assert_nothing_left(run_id)


def test_a_handshake_dropped_past_max_startups_is_tried_again(make_cluster, tmp_path: Path) -> None:
    with make_cluster(1) as lab:
        node = lab.nodes[0]
        lab.use_stock_limits(node, extra="MaxStartups 1")
        hostfile = lab.write_hostfile(tmp_path / "hosts.txt")
        # One unauthenticated connection held open: sshd drops every other new one.
        holder = socket.create_connection((node.address, 22), timeout=5)
        assert holder.recv(64).startswith(b"SSH-")
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "exec", str(hostfile), "--", "echo", "in"],
            cwd=tmp_path,
            env=lab.environ(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        log = node.sshd_log_path
        while "past MaxStartups" not in log.read_text() and time.monotonic() - started < 20:
            time.sleep(0.05)
        time.sleep(0.5)
        holder.close()
        out, err = proc.communicate(timeout=60)
        assert "past MaxStartups" in log.read_text(), (
            "the drop must be real for the test to mean it"
        )
        assert proc.returncode == 0, out + err
        assert re.search(rf"^\[{node.name}\] in$", out, re.M), out
        no_library_output(out, err)


def test_a_refused_key_is_not_tried_again(make_cluster, tmp_path: Path) -> None:
    with make_cluster(1) as lab:
        node = lab.nodes[0]
        stranger = tmp_path / "stranger"
        new_key().write(stranger)
        config = tmp_path / "config"
        config.write_text(
            textwrap.dedent(f"""
                Host {node.name}
                    User root
                    IdentityFile {stranger}
                    IdentitiesOnly yes
                    UserKnownHostsFile {lab.ssh.known_hosts_path}
            """)
        )
        hostfile = lab.write_hostfile(tmp_path / "hosts.txt")
        before = lab_log_count(node.sshd_log_path)
        done = run_cli(
            ["exec", str(hostfile), "--ssh-config", str(config), "--", "true"],
            cwd=tmp_path,
            env=lab.environ(),
            timeout=60,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"{node.name}: authentication failed as root@" in done.stderr, done.stderr
        time.sleep(0.5)  # sshd writes its line as the connection closes
        assert lab_log_count(node.sshd_log_path) - before == 1, node.sshd_log_path.read_text()
        no_library_output(done.stdout, done.stderr)


def lab_log_count(log: Path) -> int:
    """Connections sshd closed before authentication ended (one per try)."""
    text = log.read_text() if log.exists() else ""
    return len(re.findall(r"Connection closed by authenticating user|Connection reset by", text))
