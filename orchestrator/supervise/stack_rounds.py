"""Taking every rank's stacks through the node agents, and keeping them in the run record.

A round asks every running node at once (`stacks SEQ METHOD`, see agent/protocol.py), so
the stacks of all ranks are taken within the same second; each node answers with one K
frame of records (agent/stacks.py). A round ends when every node asked has answered, or
after ROUND_TIMEOUT_S (FLIGHT_EXTRA_S more with the flight recorder's dumps); a node that
did not answer by then is named. Every round is written
whole to runs/<run-id>/stacks/<time>/: one text file per rank and stacks.json (the records,
the folded groups as shown, the nodes that did not answer, and which request it answers).

`orchestrator stacks RUN` reaches a running controller through the run record: it writes
requests/stacks-<id>.json, which the supervision loop finds on its next pass (at most
IDLE_TICK_S away), and waits for a round whose stacks.json names that id.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from orchestrator.agent.protocol import stacks_command
from orchestrator.supervise.stack_groups import fold, is_main, render_groups

# An agent gives each way of taking a rank's stack up to 5 s (agent/main.STACK_TIMEOUT_S):
# py-spy then the signal, 10 s at worst, and then the frame's way here.
ROUND_TIMEOUT_S = 12.0
FLIGHT_EXTRA_S = 5.0  # with the flight recorder: an agent gives the dumps up to 5 s more
REQUESTS = "requests"
STACKS = "stacks"
METHODS = ("auto", "py-spy", "signal")


@dataclass
class StackRound:
    seq: int
    why: str
    method: str
    asked: set[int]  # node indexes
    began: float  # monotonic
    began_wall: float
    request: str | None = None  # the id of the `orchestrator stacks` request it answers
    answered: set[int] = field(default_factory=set)
    records: list[dict] = field(default_factory=list)
    flight: bool = False  # each rank's flight recorder asked for too (agent/flight.py)
    dumps: dict[int, bytes] = field(default_factory=dict)  # rank -> its flight recorder
    not_dumped: dict[int, str] = field(default_factory=dict)  # rank -> why none came
    folder: Path | None = None  # where it was written, once ended
    lines: list[str] = field(default_factory=list)  # the folded groups, once ended
    odd: tuple[int, ...] = ()  # the first group's ranks, once ended, where there are two or more

    @property
    def missing(self) -> set[int]:
        return self.asked - self.answered

    @property
    def timeout(self) -> float:
        """How long its nodes have to answer."""
        return ROUND_TIMEOUT_S + (FLIGHT_EXTRA_S if self.flight else 0.0)


class Sender(Protocol):
    """What a round needs of a node's session."""

    index: int

    def send(self, line: str, may_skip: bool = False) -> None: ...


class StackRounds:
    """Rounds of stacks: begun here, answered by the nodes' K frames, ended by `tick`."""

    def __init__(
        self,
        sessions: Sequence[Sender],
        hosts: dict[int, str],  # rank -> host
        node_hosts: dict[int, str],  # node index -> host
        record_dir: Path | None,
        note: Callable[[str], None],
    ) -> None:
        self.sessions = sessions  # the caller may still be adding to it while nodes start
        self.hosts = hosts
        self.node_hosts = node_hosts
        self.record_dir = record_dir
        self.note = note
        self.open: dict[int, StackRound] = {}
        self.seq = 0
        self.requests_seen: float | None = None  # the requests folder's mtime last looked at
        self.left: dict[int, bytes] = {}  # rank -> the flight recorder torch dumped itself

    def begin(
        self,
        why: str,
        running: set[int],
        method: str = "auto",
        request: str | None = None,
        flight: bool = False,
    ) -> StackRound | None:
        """Ask every running node (by index) for its ranks' stacks (and, with `flight`,
        their flight recorders); None when none runs and nobody waits for the answer."""
        targets = [s for s in self.sessions if s.index in running]
        if not targets and request is None:
            return None  # a request gets its (empty) answer all the same
        self.seq += 1
        round_ = StackRound(
            self.seq,
            why,
            method,
            {s.index for s in targets},
            time.monotonic(),
            time.time(),
            request,
            flight=flight,
        )
        self.open[round_.seq] = round_
        for session in targets:
            session.send(stacks_command(round_.seq, method, flight))
        return round_

    def dumped(self, seq: str, rank: str, word: str, data: bytes) -> None:
        """An L frame: a rank's flight recorder dump, or why there is none. It comes before
        its node's K frame, which ends the node's part of the round; `end` for a dump torch
        wrote by itself, sent after a failure."""
        if seq == "end":  # left by torch (agent/flight.py), after a failure: no round's
            if word == "ok" and rank.isdigit():
                self.left[int(rank)] = data
            return
        round_ = self.open.get(int(seq)) if seq.isdigit() else None
        if round_ is None or not rank.isdigit():
            return
        if word == "ok":
            round_.dumps[int(rank)] = data
        else:
            round_.not_dumped[int(rank)] = data.decode(errors="replace")

    def received(self, node: int, seq: str, data: bytes) -> None:
        round_ = self.open.get(int(seq)) if seq.isdigit() else None
        if round_ is None or node in round_.answered:
            return  # a round that timed out already, or a second answer
        round_.answered.add(node)
        try:
            records = json.loads(data)
        except ValueError:
            records = []
        host = self.node_hosts.get(node)
        round_.records.extend({**r, "host": host} for r in records if isinstance(r, dict))

    def tick(self, now: float, gone: frozenset[int] | set[int] = frozenset()) -> list[StackRound]:
        """The rounds that ended: every node asked answered (or is `gone`: lost or done),
        or its timeout passed. Each is written to the record before it is returned."""
        ended = [
            r for r in self.open.values() if not (r.missing - gone) or now - r.began >= r.timeout
        ]
        for round_ in ended:
            del self.open[round_.seq]
            self.finish(round_)
        return ended

    def finish(self, round_: StackRound) -> None:
        round_.records.sort(key=lambda r: r.get("rank", -1))
        groups = fold(round_.records, self.hosts)
        round_.lines = render_groups(groups)
        round_.odd = groups[0].ranks if len(groups) > 1 else ()
        round_.lines += [
            f"[{self.node_hosts.get(i, i)}] no answer within {round_.timeout:g} s"
            for i in sorted(round_.missing)
        ]
        if self.record_dir is None:
            return
        try:
            round_.folder = write_round(self.record_dir, round_, self.node_hosts)
        except OSError as exc:  # a full disk: the console still shows the groups
            self.note(f"could not write the stacks to the run record: {exc}")

    def requests(self) -> list[tuple[str, str]]:
        """(request id, method) of `orchestrator stacks` requests not taken yet; each is
        taken (its file removed) as it is returned. A stat a pass while there are none."""
        if self.record_dir is None:
            return []
        folder = self.record_dir / REQUESTS
        try:
            mtime = folder.stat().st_mtime
        except OSError:
            return []
        if mtime == self.requests_seen:
            return []
        self.requests_seen = mtime
        found = []
        for path in sorted(folder.glob("stacks-*.json")):
            try:
                asked = json.loads(path.read_text(encoding="utf-8"))
                path.unlink()
            except (OSError, ValueError):
                continue
            method = asked.get("method") if isinstance(asked, dict) else None
            found.append((path.stem[len("stacks-") :], method if method in METHODS else "auto"))
        return found


def write_round(record_dir: Path, round_: StackRound, node_hosts: dict[int, str]) -> Path:
    """runs/<run-id>/stacks/<time>/: rank-N.txt per rank and stacks.json; the folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(round_.began_wall))
    folder = record_dir / STACKS / f"{stamp}-{round_.seq}"
    folder.mkdir(parents=True, exist_ok=True)
    for record in round_.records:
        (folder / f"rank-{record.get('rank')}.txt").write_text(rank_text(record), encoding="utf-8")
    document = {
        "seq": round_.seq,
        "why": round_.why,
        "request": round_.request,
        "method": round_.method,
        "taken_at": round_.began_wall,
        "seconds": round(time.monotonic() - round_.began, 3),
        "groups": round_.lines,
        "no_answer": [node_hosts.get(i, str(i)) for i in sorted(round_.missing)],
        "ranks": round_.records,
    }
    temporary = folder / ".stacks.json.tmp"
    temporary.write_text(json.dumps(document, indent=1), encoding="utf-8")
    os.replace(temporary, folder / "stacks.json")  # whole, for a reader waiting on it
    return folder


def rank_text(record: dict) -> str:
    """One rank's stacks as text, innermost frame last, as Python prints a traceback; then
    those of its child processes, each the same way."""
    lines = process_text(record, f"rank {record.get('rank')} pid {record.get('pid')}")
    for child in record.get("children") or ():
        who = f"child process {child.get('name') or '?'} pid {child.get('pid')}"
        lines += ["", *process_text(child, f"{who} (parent {child.get('parent')})")]
    left = record.get("children_left")
    if left:
        lines += ["", f"and {left} more child process(es), not taken"]
    return "\n".join(lines) + "\n"


def process_text(record: dict, who: str) -> list[str]:
    """One process's threads, as `rank_text` writes them, under the line `who: taken by`."""
    how = record.get("method") or "not taken"
    pause = record.get("pause_s")
    lines = [
        f"{who}: taken by {how}" + (f", paused {pause * 1000:.1f} ms" if pause is not None else "")
    ]
    if record.get("error"):
        lines.append(f"no stack: {record['error']}")
    for thread in record.get("threads") or ():
        name = thread.get("name") or "(no name)"
        idle = {True: ", idle", False: ", active"}.get(thread.get("idle"), "")
        main = ", main" if is_main(thread) else ""
        lines.append(f"\nthread {name} ({thread.get('id')}{main}{idle}), most recent call last:")
        for frame in reversed(thread.get("frames") or ()):
            where, line = frame.get("file"), frame.get("line")
            lines.append(f'  File "{where}", line {line}, in {frame.get("function")}')
    return lines


def ask_for_stacks(record_dir: Path, request: str, method: str) -> None:
    """`orchestrator stacks`: leave a request for the run's controller (see the docstring)."""
    folder = record_dir / REQUESTS
    folder.mkdir(exist_ok=True)
    temporary = folder / f".stacks-{request}.tmp"
    temporary.write_text(json.dumps({"method": method}), encoding="utf-8")
    os.replace(temporary, folder / f"stacks-{request}.json")
    with contextlib.suppress(OSError):  # a new mtime even within the same clock tick
        os.utime(folder)


def answer_to(record_dir: Path, request: str, since: float = 0.0) -> dict | None:
    """The stacks.json of the round that answered `request`, once written; only those
    written at `since` (time.time()) or later are read, so a waiting reader does not parse
    every earlier round again at each look."""
    for path in sorted((record_dir / STACKS).glob("*/stacks.json"), reverse=True):
        try:
            if path.stat().st_mtime < since:
                continue
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if document.get("request") == request:
            return {**document, "folder": str(path.parent)}
    return None
