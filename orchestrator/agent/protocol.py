"""The agent's wire protocol: frames to the controller, commands and step configs from it.

Frames to the controller (stdout): an ASCII header line `TYPE field...`, followed, for
types with a length field, by exactly that many payload bytes. TYPE is one letter, named
by `Frame`:
  S pid t [addrs]    started           O rank n + data   rank output (whole lines)
  N q n + data       script output     E rank rc t s     a rank exited (s: 1 if after a stop)
  F rank n + data    rank error file   M n + data        a message from the agent
  H t3 t1 t2         heartbeat         X rc t            finished; nothing follows
  W ERRNO t n + dir  the node directory cannot be written (ENOSPC, EDQUOT, EIO, EROFS)
  Q rank n + data   the rank's metrics channel (whole JSON lines it wrote)
  P n + data        a node sample, one JSON object (agent/sampling.py)
  K seq n + data    the ranks' stacks asked for by `stacks SEQ`, one JSON list (stacks.py)
  L seq rank ok|no n + data   a rank's flight recorder dump (a pickle), or why none (flight.py)
  G SIG t sent skipped   the time limit's warning went to ranks `sent` ("0,1"; "-": none) at
                    t; `skipped` ranks do not catch SIG and were not sent it (stacks.py)
  U addr port s store|peer who   the step's process `who` (rank3, torchrun) has had no
                    answer from addr:port for s seconds: the store or a peer (connects.py)
S's addrs are the node's IPv4 addresses (`eth0=10.0.0.2,ib0=...`; route.addresses), by
which the controller names the node a U's address belongs to. Every t is the node's wall
clock. H echoes the controller's last `hb T1` (t1) with the time the agent read it (t2),
`-` before any: one NTP round trip (orchestrator.supervise.clocks).
E's s says whether the rank ended after the agent began stopping the step, both times in the
node's clock, so a stopped rank is told from a failed one whatever the clocks say. N's q is 1
for the script's output read after the stop began: torchrun's shutdown, quiet on the console.
W comes before the E or X it explains (agent/disk.py).
Commands from the controller (stdin lines, named by `Command`; each has one encoder, used
by the controller, and one decoder, used by the agent's CommandReader): `hb T1`, `stop
GRACE`, `kill`, and `stacks SEQ METHOD [flight]` (every rank's stacks, answered by K with
the same SEQ; with `flight`, each rank's flight recorder first, an L each), `end RANK,...`
(SIGKILL to those ranks' processes alone: a hang ended so that torchrun restarts the
workers; the step goes on), and `signal USR1|USR2` (the time limit's warning to every
rank's process, answered by G).
A step's config (JSON's types only) is marshal data, version 4, which every Python 3 since
3.4 reads with a built-in module (json would cost each node's start-up 10 ms of imports and
regular expressions), with an 8-digit length prefix; after X, a `next` line announces the
next.

Standard library only: this module runs on the nodes too (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import marshal
import os
import select
import time
from enum import Enum

# Type names only, not imported at run time (see processes.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


class Frame(str, Enum):
    """A frame's kind: the one letter that begins its header on the wire."""

    STARTED = "S"  # the node script started
    RANK_OUTPUT = "O"  # whole lines a rank wrote
    SCRIPT_OUTPUT = "N"  # whole lines of the node script's own output (torchrun's)
    RANK_EXITED = "E"
    ERROR_FILE = "F"  # a rank's error file (torchrun's)
    MESSAGE = "M"  # a message from the agent
    HEARTBEAT = "H"
    FINISHED = "X"  # the step ended; nothing follows
    DISK_FAULT = "W"  # the node directory cannot be written
    METRICS = "Q"  # whole JSON lines of a rank's metrics channel
    NODE_SAMPLE = "P"
    STACKS = "K"  # the ranks' stacks a `stacks SEQ` asked for
    FLIGHT_DUMP = "L"  # a rank's flight recorder dump, or why there is none
    TIME_WARNING = "G"  # the time limit's warning went to the ranks
    NO_ANSWER = "U"  # the step's processes cannot connect to an address: no answer

    def __str__(self) -> str:
        return self.value  # the letter, in str() and f-strings alike on every Python 3


# The kinds whose last header field is a length.
WITH_PAYLOAD = frozenset(
    {
        Frame.RANK_OUTPUT,
        Frame.SCRIPT_OUTPUT,
        Frame.ERROR_FILE,
        Frame.MESSAGE,
        Frame.DISK_FAULT,
        Frame.METRICS,
        Frame.NODE_SAMPLE,
        Frame.STACKS,
        Frame.FLIGHT_DUMP,
    }
)
# Heartbeats (agent -> controller `H`, controller -> agent `hb`), both ways: one a second
# while the clocks are first compared (clocks.py), then steady, between FASTEST_BEAT_S and
# SLOWEST_BEAT_S: the agent's one per heartbeat_timeout / AGENT_BEATS, so that a beat is
# late by a sixth of the timeout before liveness starts asking the node's sshd (at half of
# it), and the controller's one per heartbeat_timeout / CONTROLLER_BEATS, so that an agent
# misses two before it starts asking whether the controller's host is there. A quiet job of
# 1 000 nodes costs the controller what its messages cost (benchmarks/idle_controller.py):
# at the default timeout (30 s), five per node in 30 s, two out and three in (two H, and the
# quiet node's P sample, which stands in for a third). A steady H waits while the agent
# writes other frames (any bytes say it is there), up to BEATS_DEFERRED beats in a row: one
# still goes out every 4 beats, so the clocks go on being compared while ranks print.
FIRST_BEATS = 5
FIRST_BEAT_S = 1.0
FASTEST_BEAT_S = 0.5
SLOWEST_BEAT_S = 15.0
AGENT_BEATS = 3  # per heartbeat timeout
CONTROLLER_BEATS = 2
BEATS_DEFERRED = 3
# The supervision a config that does not say gets: the launch's own defaults (--grace,
# --heartbeat-timeout, --stall-timeout; orchestrator/options/supervision.py takes them from
# here, so the two sides of the protocol hold one number each).
GRACE_S = 10.0  # between SIGTERM and SIGKILL on a stop
HEARTBEAT_TIMEOUT_S = 30.0  # a controller silent this long (and not answering) is gone
STALL_S = 600.0  # how long a silent controller whose host answers is waited for
# How long a finished agent waits for the controller's next step. The launch's preflight
# ends once its slowest node answers, and planning follows: at 250 nodes on a loaded
# machine that took minutes, and an agent that had left meant a second session on every
# node while they were busiest (opening one then timed out). Waiting costs nothing (a
# blocked read), and an agent whose controller is gone sees its connection close at once.
IDLE_S = 600.0


def beat_intervals(heartbeat_timeout: float, per_timeout: int):
    """The pauses between heartbeats: FIRST_BEATS of FIRST_BEAT_S, then `per_timeout`
    steady ones per heartbeat timeout (AGENT_BEATS or CONTROLLER_BEATS)."""
    steady = SLOWEST_BEAT_S if heartbeat_timeout <= 0 else heartbeat_timeout / per_timeout
    steady = min(SLOWEST_BEAT_S, max(FASTEST_BEAT_S, steady))
    for _ in range(FIRST_BEATS):
        yield min(FIRST_BEAT_S, steady)
    while True:
        yield steady


def frame(kind: Frame, *fields: object, payload: bytes | None = None) -> bytes:
    """Encode one frame; `payload` adds its length as the last header field."""
    head = " ".join([kind, *(str(f) for f in fields)])
    if payload is None:
        return head.encode() + b"\n"
    return f"{head} {len(payload)}\n".encode() + payload


def length_prefixed(data: bytes) -> bytes:
    return b"%08d" % len(data) + data


def encode_config(config: dict) -> bytes:
    return length_prefixed(marshal.dumps(config, 4))


def read_exact(n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            raise SystemExit("orchestrator agent: the controller went away")
        data += chunk
    return data


def read_config() -> dict:
    return marshal.loads(read_exact(int(read_exact(8))))


class Command(str, Enum):
    """A command's kind: the word that begins its line on the wire (stdin, one a line)."""

    HEARTBEAT = "hb"  # hb T1: the controller's clock, echoed by the agent's next H
    STOP = "stop"  # stop [GRACE]: SIGTERM to the step, SIGKILL after GRACE s
    KILL = "kill"  # SIGKILL to the step now
    STACKS = "stacks"  # stacks SEQ METHOD [flight]: every rank's stacks, answered by K
    END = "end"  # end RANK,...: SIGKILL to those ranks' processes alone
    SIGNAL = "signal"  # signal USR1|USR2: the time limit's warning, answered by G
    NEXT = "next"  # between steps: the next step's config follows

    def __str__(self) -> str:
        return self.value  # the word, in str() and f-strings alike on every Python 3


# Encoders, the controller's side: each command's line, without its newline.
def heartbeat_command(t1: float) -> str:
    return f"{Command.HEARTBEAT} {t1:.6f}"


def stop_command(grace: float) -> str:
    return f"{Command.STOP} {grace:g}"


def kill_command() -> str:
    return f"{Command.KILL}"


def stacks_command(seq: int, method: str, flight: bool) -> str:
    return f"{Command.STACKS} {seq} {method}" + (" flight" if flight else "")


def end_command(ranks: Iterable[int]) -> str:
    return f"{Command.END} {','.join(str(r) for r in ranks)}"


def signal_command(name: str) -> str:
    return f"{Command.SIGNAL} {name}"


def next_command() -> str:
    return f"{Command.NEXT}"


def command_line(command: str) -> bytes:
    """A command as it goes on the wire: its line, and the newline that ends it."""
    return command.encode() + b"\n"


# Decoders, the agent's side: a command's argument from the words of its line; a line of
# another shape is not read (_Unread). hb is kept by the reader (CommandReader.ping), and
# next is read between steps (next_config).
class _Unread(Exception):
    pass


def _no_argument(words: list[str]) -> float:
    return 0.0  # kill: no grace


def _grace(words: list[str]) -> float | None:
    return float(words[1]) if len(words) > 1 else None  # None: the config's grace


def _stacks(words: list[str]) -> str:
    if len(words) not in (3, 4):
        raise _Unread
    return " ".join(words[1:])  # "SEQ METHOD [flight]"


def _one_word(words: list[str]) -> str:
    if len(words) != 2:
        raise _Unread
    return words[1]  # end's "RANK,RANK", signal's "USR1"


DECODERS: dict[Command, Callable[[list[str]], float | str | None]] = {
    Command.STOP: _grace,
    Command.KILL: _no_argument,
    Command.STACKS: _stacks,
    Command.END: _one_word,
    Command.SIGNAL: _one_word,
}
_READ = {command.value: command for command in DECODERS}


class CommandReader:
    """The controller's command lines, from stdin as it arrives in pieces."""

    def __init__(self) -> None:
        self.partial = b""
        self.ping = ("-", "-")  # the last `hb T1`: (T1, when this node read it)

    def feed(self, chunk: bytes) -> list[tuple[Command, float | str | None]]:
        """(command, argument) for each whole line: (STOP, GRACE or None), (KILL, 0.0),
        (STACKS, "SEQ METHOD [flight]"), (END, "RANK,RANK"), (SIGNAL, "USR1").

        `hb T1` proves the controller is there (the caller notes any input as that) and
        is kept for the next heartbeat to echo.
        """
        now = time.time()
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        commands: list[tuple[Command, float | str | None]] = []
        for line in lines:
            words = line.decode(errors="replace").split()
            if not words:
                continue
            if words[0] == Command.HEARTBEAT:
                if len(words) > 1:
                    self.ping = (words[1], f"{now:.6f}")
                continue
            command = _READ.get(words[0])
            if command is None:
                continue  # a word of no command the agent reads here
            try:
                commands.append((command, DECODERS[command](words)))
            except _Unread:
                continue
        return commands


def next_config(idle_s: float) -> dict | None:
    """The config of the controller's next step, or None when stdin closes or none comes
    within `idle_s`. Lines before `next` were meant for the step that ended (a late `hb`)."""
    deadline = time.monotonic() + idle_s
    line = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([0], [], [], left)[0]:
            return None
        try:
            byte = os.read(0, 1)
        except OSError:
            return None
        if not byte:
            return None
        if byte != b"\n":
            line += byte
        elif line == Command.NEXT.value.encode():
            return read_config()
        else:
            line = b""
