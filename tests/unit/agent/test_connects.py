"""The agent's watch on connections that get no answer (agent/connects.py) and what the
controller makes of its U frame (supervise/unreachable.py, the detector, the verdict): the
socket table's lines, the age rule, the line that names the pair, the run's end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.agent import connects
from orchestrator.agent.connects import (
    ConnectWatch,
    Streaks,
    hex_address,
    socket_owners,
    syn_retransmits,
    unanswered_sockets,
)
from orchestrator.agent.protocol import Frame
from orchestrator.backends.sessions import Event
from orchestrator.options.supervision import Supervision
from orchestrator.record.states import RunState
from orchestrator.supervise import NodeState, RankState, Supervisor
from orchestrator.supervise.frame_handlers import handle
from orchestrator.supervise.unreachable import NoAnswer, node_at, parse_addresses
from tests.factories import supervisor

HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  inode\n"


def line(remote: str, state: str, resent: int, inode: int) -> str:
    return (
        f"   0: 0200000A:A1B2 {remote} {state} 00000000:00000000 01:0000012C "
        f"{resent:08X}     0        0 {inode} 1 0000000000000000 200 0 0 10 -1\n"
    )


def kernel_hex(address: str) -> str:
    """How /proc/net/tcp writes an IPv4 address: the 32-bit word in the machine's order."""
    return f"{int.from_bytes(socket.inet_aton(address), sys.byteorder):08X}"


def test_addresses_read_as_the_kernel_writes_them() -> None:
    """Checked against the kernel itself: a connection on loopback, found by its inode."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        listening = server.getsockname()
        client = socket.create_connection(listening)
        inode = os.fstat(client.fileno()).st_ino
        try:
            rows = [r.split() for r in Path("/proc/net/tcp").read_text().splitlines()[1:]]
        finally:
            client.close()
    (row,) = [r for r in rows if r[9] == str(inode)]
    address, port = row[2].split(":")
    assert (hex_address(address), int(port, 16)) == listening
    assert hex_address(kernel_hex("10.200.0.3")) == "10.200.0.3"
    mapped = socket.inet_pton(socket.AF_INET6, "::ffff:10.200.0.3")
    words = "".join(
        f"{int.from_bytes(mapped[i : i + 4], sys.byteorder):08X}" for i in (0, 4, 8, 12)
    )
    assert hex_address(words) == "10.200.0.3"  # a dual-stack socket's IPv4 peer


def test_only_syn_sent_sockets_whose_syn_was_resent_count() -> None:
    remote = f"{kernel_hex('10.200.0.3')}:7531"  # port 30001
    table = HEAD + "".join(
        [
            line(remote, "02", 2, 111),  # SYN_SENT, resent twice: no answer for 3 s
            line(remote, "02", 0, 112),  # SYN_SENT, just sent: a healthy one looks so too
            line(remote, "01", 0, 113),  # ESTABLISHED
            line(remote, "0A", 0, 114),  # LISTEN
            "garbage\n",
        ]
    )
    assert unanswered_sockets(table) == [("10.200.0.3", 30001, 2, 111)]


def test_a_remote_is_due_after_no_answer_s_of_looks_and_said_once() -> None:
    streaks = Streaks(no_answer_s=5, gap_s=3)
    remote = ("10.200.0.3", 30001)
    assert [streaks.look({remote}, t) for t in range(5)] == [[]] * 5
    assert streaks.look({remote}, 5.0) == [(*remote, 5.0)]
    assert streaks.look({remote}, 6.0) == []  # once


def test_the_store_waits_gaps_do_not_reset_the_age_but_an_answer_does() -> None:
    """The node script's wait gives up on a socket after 5 s and opens the next 0.25 s later;
    a look may fall between them (no resent SYN yet on the new one for a second)."""
    streaks, remote = Streaks(no_answer_s=5, gap_s=3), ("10.200.0.1", 29500)
    assert streaks.look({remote}, 0.0) == []
    assert streaks.look(set(), 1.0) == [] and streaks.look(set(), 2.0) == []
    assert streaks.look({remote}, 3.0) == []
    assert streaks.look({remote}, 5.0) == [(*remote, 5.0)]
    fresh = Streaks(no_answer_s=5, gap_s=3)
    fresh.look({remote}, 0.0)
    assert fresh.look(set(), 3.5) == []  # answered (or nothing tries): the streak ends
    assert [fresh.look({remote}, t) for t in (4.0, 6.0, 8.0)] == [[], [], []]
    assert fresh.look({remote}, 9.0) == [(*remote, 5.0)]


def test_a_process_that_never_tried_or_connected_is_never_reported() -> None:
    streaks = Streaks(no_answer_s=5, gap_s=3)
    assert all(streaks.look(set(), t) == [] for t in range(100))


NETSTAT = "TcpExt: SyncookiesSent TCPSynRetrans\nTcpExt: 0 {}\nIpExt: InNoRoutes\nIpExt: 0\n"


def test_the_table_is_read_only_when_a_syn_was_resent_or_a_remote_is_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert syn_retransmits(NETSTAT.format(181)) == 181
    assert syn_retransmits("IpExt: InNoRoutes\nIpExt: 0\n") is None  # then: every look
    assert syn_retransmits(Path("/proc/net/netstat").read_text()) is not None  # this kernel's
    netstat, tcp = tmp_path / "netstat", tmp_path / "tcp"
    monkeypatch.setattr(connects, "COUNTERS", str(netstat))
    monkeypatch.setattr(connects, "TABLES", (str(tcp),))
    read_table: list[float] = []
    clock = [0.0]

    def read(path: str) -> str:
        if path == str(tcp):
            read_table.append(clock[0])
        return Path(path).read_text()

    monkeypatch.setattr(connects, "read", read)
    monkeypatch.setattr(connects, "socket_owners", lambda pids: {1: pids[0]} if pids else {})
    tcp.write_text(HEAD + line(f"{kernel_hex('10.200.0.3')}:7531", "02", 1, 1))
    watch = ConnectWatch(Streaks(no_answer_s=5, gap_s=3))
    for now, resent, pids in [
        (0.0, 5, []),  # the first look reads the table: a socket, but not the step's
        (1.0, 5, []),  # nothing resent since: not read
        (2.0, 6, [os.getpid()]),  # a SYN resent on the node: read (now the step's, say)
        (3.0, 6, [os.getpid()]),  # nothing resent, but the remote is followed: read
    ]:
        clock[0] = now
        netstat.write_text(NETSTAT.format(resent))
        watch.look(lambda pids=pids: pids, now)
        if now == 1.0:
            assert not watch.streaks.since
    assert read_table == [0.0, 2.0, 3.0]


def holder(env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """A process of the job holding a socket, with the environment torchrun gives."""
    code = (
        "import os, socket, sys; s = socket.socket()\n"
        "print(os.fstat(s.fileno()).st_ino, flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, **env},
        text=True,
    )
    return proc, int(proc.stdout.readline())


@pytest.mark.parametrize(
    ("env", "remote", "role", "who"),
    [
        (
            {"MASTER_ADDR": "10.200.0.1", "MASTER_PORT": "29500"},
            ("10.200.0.1", 29500),
            "store",
            "torchrun",
        ),
        (
            {"MASTER_ADDR": "10.200.0.1", "MASTER_PORT": "29500", "RANK": "3"},
            ("10.200.0.3", 30001),
            "peer",
            "rank3",
        ),
    ],
)
def test_the_watch_names_what_a_process_of_the_step_could_not_reach(
    env, remote, role, who, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, inode = holder(env)
    try:
        tcp = tmp_path / "tcp"
        hexed = f"{kernel_hex(remote[0])}:{remote[1]:04X}"
        tcp.write_text(HEAD + line(hexed, "02", 1, inode) + line(hexed, "02", 1, inode + 1))
        monkeypatch.setattr(connects, "TABLES", (str(tcp), str(tmp_path / "no-tcp6")))
        assert inode in socket_owners([proc.pid]) and inode + 1 not in socket_owners([proc.pid])
        watch = ConnectWatch(Streaks(no_answer_s=5, gap_s=3))
        assert watch.look(lambda: [proc.pid], 0.0) == []
        assert watch.look(lambda: [os.getpid()], 1.0) == []  # not the step's: not seen
        assert watch.look(lambda: [proc.pid], 3.0) == []
        assert watch.look(lambda: [proc.pid], 5.0) == [(*remote, 6.0, role, who)]
    finally:
        proc.stdin.close()
        proc.wait()


def three_nodes(tmp_path: Path) -> Supervisor:
    """A rank on each of node0..node2, each node at the address its agent said."""
    nodes = [NodeState(i, f"node{i}", (i,), addresses=(f"10.200.0.{i + 1}",)) for i in range(3)]
    ranks = [RankState(r, r, 0, f"node{r}") for r in range(3)]
    supervision = Supervision(grace=3, heartbeat_timeout=30)
    return supervisor(tmp_path, nodes=nodes, ranks=ranks, supervision=supervision)


def no_answer(node: int, *fields: object) -> Event:
    return Event(node, Frame.NO_ANSWER, tuple(str(f) for f in fields), b"")


def test_the_nodes_addresses_come_with_s_and_name_the_node() -> None:
    assert parse_addresses("eth0=10.200.0.2,ib0=10.201.0.2") == ("10.200.0.2", "10.201.0.2")
    assert parse_addresses("-") == ()
    nodes = [NodeState(0, "a", addresses=("10.0.0.1",)), NodeState(1, "10.0.0.9")]
    assert node_at(nodes, "10.0.0.1") is nodes[0] and node_at(nodes, "10.0.0.9") is nodes[1]
    assert node_at(nodes, "10.0.0.5") is None


def test_a_pair_that_cannot_connect_ends_the_run_unreachable_named_once(tmp_path: Path) -> None:
    sup = three_nodes(tmp_path)
    handle(sup, no_answer(1, "10.200.0.3", 30001, 6, "peer", "rank1"))
    assert sup.stopping and sup.stopper.reason == "node1 cannot reach node2"
    handle(sup, no_answer(2, "10.200.0.2", 30002, 7, "peer", "rank2"))  # the other end
    outcome = sup.detector.outcome()
    assert (outcome.state, outcome.exit_code) == (RunState.UNREACHABLE, 1)
    assert outcome.summary.splitlines() == [
        "job failed: a node cannot reach another:",
        "  node1 cannot reach a peer's port on node2 at 10.200.0.3:30001: rank 1's connection "
        "got no answer for 6 s (packets dropped on the way: a firewall rule or a route)",
    ]
    assert outcome.node_fault is None
    assert sup.status()["unreachable"] == [outcome.summary.splitlines()[1].strip()]


def test_the_store_is_node_0s_whatever_address_it_was_reached_at(tmp_path: Path) -> None:
    sup = three_nodes(tmp_path)
    handle(sup, no_answer(2, "192.168.9.9", 29500, 6, "store", "torchrun"))
    line = sup.detector.unreachable_lines[0]
    assert line.startswith("node2 cannot reach the store on node0 at 192.168.9.9:29500: torchrun")


def test_an_address_of_no_node_is_said_but_stops_nothing(tmp_path: Path) -> None:
    sup = three_nodes(tmp_path)
    said = NoAnswer.of(sup.nodes, sup.nodes[1], ("203.0.113.5", "443", "6", "peer", "rank1"))
    assert said.pair is None and "(an address of no node of this run)" in said.line()
    handle(sup, no_answer(1, "203.0.113.5", 443, 6, "peer", "rank1"))
    assert not sup.stopping and not sup.detector.unreachable_lines


def test_after_a_stop_for_another_reason_it_is_only_said(tmp_path: Path) -> None:
    sup = three_nodes(tmp_path)
    sup.begin_stop(3, "rank 0 failed")
    handle(sup, no_answer(1, "10.200.0.3", 30001, 6, "peer", "rank1"))
    assert not sup.detector.unreachable_lines
