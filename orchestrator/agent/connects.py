"""Connections the job's processes cannot make, as the kernel's socket table shows them
(Linux /proc, standard library only).

A healthy network completes a TCP handshake in milliseconds: the SYN is answered by the
peer's kernel, whatever its processes are doing (busy, importing torch, not yet listening:
that is a refusal, at once). So a socket of the job's processes that stays in SYN_SENT
after the kernel resent its SYN means the packets are dropped on the way (a firewall rule,
a route, a security group open to SSH only), and one that stays so for NO_ANSWER_S is a
path the job cannot use.

The watch looks every LOOK_S, first at the node's count of resent SYNs (TCPSynRetrans in
/proc/net/netstat, a fraction of a millisecond). Only when it grew, or while a remote is
being followed, does it read the socket table (/proc/net/tcp and tcp6: the kernel walks its
whole connection hash for them, some 4 ms each on the lab's machine) and, where a SYN_SENT
socket's SYN was resent (retransmits >= 1), which of them belong to the step's processes
(/proc/PID/fd). A healthy node resends no SYN, so its watch costs one small read a second.

A remote address and port is "not answering" while such sockets to it are seen at every
look, gaps of up to GAP_S allowed (the node script's wait for the store gives up on a
socket after 5 s and opens the next a quarter of a second later); NO_ANSWER_S of that and
it is reported, once. A process that has not tried yet, or whose connections complete or
are refused, has no such socket: it is never reported. A refused connection (a reset, an
ICMP error) leaves nothing in the table, and a store that is not open yet answers the same
way, which torch retries by design: those are the preflight's to name (nodes/paths).

Each socket's owner says what it was for: its environment's MASTER_ADDR:MASTER_PORT is the
store (the node script's wait, torchrun's rendezvous, a rank's store client); any other
address is a peer (gloo's or NCCL's mesh), named by the controller from the nodes' own
addresses (route.addresses, sent with S).
"""

from __future__ import annotations

import os
import socket
import struct

# Type names only, not imported at run time (see processes.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

SYN_SENT = "02"  # include/net/tcp_states.h
LOOK_S = 1.0
NO_ANSWER_S = 5.0  # after a first resent SYN: so unanswered for 6 s at least
GAP_S = 3.0
FIRST_RESEND_S = 1.0  # the kernel resends an unanswered SYN first after 1 s (TCP_TIMEOUT_INIT)
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
COUNTERS = "/proc/net/netstat"


def hex_address(text: str) -> str:
    """An address of /proc/net/tcp (IPv4: 8 hex digits) or tcp6 (32), as the kernel keeps it
    (32-bit words in the machine's order), in its usual form; an IPv4-mapped IPv6 address
    (::ffff:10.0.0.1, a dual-stack socket) as the IPv4 address it is."""
    words = struct.pack(
        f"={len(text) // 8}I", *(int(text[i : i + 8], 16) for i in range(0, len(text), 8))
    )
    if len(words) == 4:
        return socket.inet_ntop(socket.AF_INET, words)
    if words[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, words[12:])
    return socket.inet_ntop(socket.AF_INET6, words)


def unanswered_sockets(table: str) -> list[tuple[str, int, int, int]]:
    """(remote address, remote port, retransmits, inode) of every socket in SYN_SENT whose
    SYN the kernel has resent at least once, from the text of /proc/net/tcp or tcp6."""
    found = []
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != SYN_SENT:
            continue
        try:
            resent, inode = int(fields[6], 16), int(fields[9])
            address, port = fields[2].split(":")
            if resent >= 1:
                found.append((hex_address(address), int(port, 16), resent, inode))
        except ValueError:
            continue
    return found


def syn_retransmits(netstat: str) -> int | None:
    """TCPSynRetrans of /proc/net/netstat's TcpExt lines (names, then values); None where
    the kernel does not count it (then the table is read at every look)."""
    lines = [line.split() for line in netstat.splitlines() if line.startswith("TcpExt:")]
    if len(lines) < 2:
        return None
    value = dict(zip(lines[0], lines[1], strict=False)).get("TCPSynRetrans")
    return int(value) if value is not None and value.isdigit() else None


def socket_owners(pids: list[int]) -> dict[int, int]:
    """socket inode -> the pid holding it, among `pids` (a process that ended is skipped)."""
    owners: dict[int, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners.setdefault(int(target[8:-1]), pid)
    return owners


def environ_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            data = handle.read()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in data.split(b"\0"))
    return {name: value for name, _, value in pairs if name}


def store_of(environ: dict[str, str]) -> tuple[str, int] | None:
    """The store's address and port a process of the job was given, as an address."""
    host, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        return None
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0], int(port)
    except (OSError, IndexError):
        return host, int(port)


class Streaks:
    """The age rule: since when each remote has had unanswered sockets at every look."""

    def __init__(self, no_answer_s: float = NO_ANSWER_S, gap_s: float = GAP_S) -> None:
        self.no_answer_s = no_answer_s
        self.gap_s = gap_s
        self.since: dict[tuple[str, int], float] = {}
        self.seen: dict[tuple[str, int], float] = {}
        self.said: set[tuple[str, int]] = set()

    def look(self, remotes: set[tuple[str, int]], now: float) -> list[tuple[str, int, float]]:
        """The remotes seen now; those unanswered for no_answer_s, each once, with how long."""
        for remote in [r for r, at in self.seen.items() if now - at > self.gap_s]:
            del self.seen[remote], self.since[remote]  # it answered, or nothing tries now
        due = []
        for remote in sorted(remotes):
            since = self.since.setdefault(remote, now)
            self.seen[remote] = now
            if now - since >= self.no_answer_s and remote not in self.said:
                self.said.add(remote)
                due.append((*remote, now - since))
        return due


def who(pid: int, environ: dict[str, str]) -> str:
    """The process, in words for the report's last field: `rank3` or `torchrun`."""
    rank = environ.get("RANK", "")
    if rank.isdigit():
        return f"rank{rank}"
    return "torchrun" if "MASTER_PORT" in environ else f"pid{pid}"


def read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


class ConnectWatch:
    """What the step's processes cannot connect to: one report per remote address and port,
    `(address, port, seconds, "store" | "peer", who)` (see the module's docstring)."""

    def __init__(self, streaks: Streaks | None = None) -> None:
        self.streaks = streaks or Streaks()
        self.owner: dict[tuple[str, int], int] = {}  # remote -> a pid whose socket it is
        self.resent: int | None = -1  # TCPSynRetrans at the last look (-1: none yet)

    def look(
        self, pids: Callable[[], list[int]], now: float
    ) -> list[tuple[str, int, float, str, str]]:
        """The reports due now; `pids` (the step's processes) is asked only when a SYN was
        resent on this node."""
        resent, self.resent = self.resent, syn_retransmits(read(COUNTERS))
        followed = set(self.streaks.since) - self.streaks.said
        if resent == self.resent and resent is not None and not followed:
            return []  # no SYN resent here since the last look, and no remote followed
        syns = [s for table in TABLES for s in unanswered_sockets(read(table))]
        remotes: set[tuple[str, int]] = set()
        if syns:
            owners = socket_owners(pids())
            for address, port, _, inode in syns:
                if inode in owners:
                    remotes.add((address, port))
                    self.owner[(address, port)] = owners[inode]
        reports = []
        for address, port, seconds in self.streaks.look(remotes, now):
            pid = self.owner[(address, port)]
            environ = environ_of(pid)
            role = "store" if store_of(environ) == (address, port) else "peer"
            reports.append((address, port, FIRST_RESEND_S + seconds, role, who(pid, environ)))
        return reports
