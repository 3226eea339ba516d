"""Hangs: a run whose ranks make no progress is told stuck from working by their main threads.

Progress is the program's, not any printed line: a rank progresses when it reports a new
step on the metrics channel (a record whose `step` differs from its last; one that repeats
it is not progress), or when its main thread, or that of a child process of its own (a
DataLoader worker), moves between the two samples of a check (stack_groups.moved: its stack
changed, or it wanted half a core in its own code). When no
rank has progressed for the hang timeout, while every node still runs and answers, the
stacks of every rank are taken twice, SAMPLE_GAP_S apart (stack_rounds.py). If any rank's
main thread moved, the job works: that is said once, it counts as progress, and the next
check comes a whole timeout later. If none moved, the run hangs: `Hang` names the ranks and
where they wait, the odd group first, and the supervisor ends the run through the verdict
table (state `hung`) before anything is killed. The second sample also asks every rank for
torch's flight recorder (flight_report.py): a hang's record holds the dumps and torch's own
reading of them, naming the collective the stuck ranks never joined.

Output only postpones a check: a printed line (or a metrics record without a new step) is a
sign of life, not of progress (a logging thread prints while every main thread waits), so a
due check waits for a lull of LULL_S in the ranks' output, LULL_S at most, and a line
cancels neither a check nor its second sample. A run whose ranks print but whose main
threads stay put is so found hung about timeout + LULL_S + SAMPLE_GAP_S (and the two rounds,
a second or so each) after its last progress. A run that prints and works without reporting
a step is checked once every timeout + LULL_S + SAMPLE_GAP_S, and said working once.

The default timeout, 300 s: half of NCCL's own collective timeout (600 s), so a hang is
named, with its stacks, well before torch's watchdog kills the job and names whichever rank
timed out first; and longer than what real jobs spend without a step on purpose (a
checkpoint written to a slow file system, an evaluation pass), which the second sample
usually tells apart anyway. A check costs each rank two stacks and two reads of its main
thread's CPU (/proc/PID/task/PID/stat and schedstat): with py-spy, about 25 ms of the node's
CPU and the rank stopped about a millisecond a stack on an idle core
(benchmarks/hang_check_cost.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.agent.protocol import end_command
from orchestrator.hostlist import name_ranks
from orchestrator.record.runs import now_iso
from orchestrator.supervise.flight_report import FlightReport, collect
from orchestrator.supervise.stack_groups import moved
from orchestrator.supervise.stack_rounds import Sender, StackRound, StackRounds

if TYPE_CHECKING:
    from orchestrator.supervise.detect import Detector

SAMPLE_GAP_S = 5.0  # between the two samples of a check
LULL_S = 5.0  # a due check waits for a pause this long in the ranks' output, this long at most
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Hang:
    """A run found stuck: for how long no rank progressed, its second round of stacks, and
    what torch's flight recorder says of it (flight_report.py; None without dumps)."""

    quiet_s: float
    stacks: StackRound
    flight: FlightReport | None = None
    flight_lines: tuple[str, ...] = ()

    def status(self) -> dict:
        """status.json's `hang`: when it was found, the groups as shown (the odd group's
        ranks as `stuck_ranks`), where the stacks are, the flight recorder's finding."""
        return {
            "found_at": now_iso(self.stacks.began_wall),
            "quiet_s": round(self.quiet_s, 1),
            "groups": self.stacks.lines,
            "stuck_ranks": list(self.stacks.odd),
            "stacks": str(self.stacks.folder) if self.stacks.folder else None,
            **({"flight": self.flight.status()} if self.flight is not None else {}),
        }

    def console_lines(self) -> list[str]:
        where = f"; stacks of every rank in {self.stacks.folder}" if self.stacks.folder else ""
        head = f"hung: no new step and no main thread moved for {self.quiet_s:.0f} s{where}"
        return [head, *self.stacks.lines, *self.flight_lines]

    def summary(self) -> str:
        groups = self.stacks.lines
        first = groups[0] if groups else "no stacks"
        lines = [f"job hung: no rank moved for {self.quiet_s:.0f} s; {first}"]
        lines += [f"  {line}" for line in groups[1:]]
        lines += list(self.flight_lines)
        if self.stacks.folder:
            lines.append(f"stacks of every rank: {self.stacks.folder}")
        return "\n".join(lines)


class HangWatch:
    """Watches a run's progress, and checks a run without any with two rounds of stacks."""

    def __init__(
        self,
        rounds: StackRounds,
        timeout: float,
        note: Callable[[str], None],
        now: float,
    ) -> None:
        self.rounds = rounds
        self.timeout = timeout  # 0: never checked
        self.note = note
        self.quiet_since = now  # monotonic: the last progress (a new step, a main thread moved)
        self.next_check = now + timeout  # a check is due (output may postpone it: begins_at)
        self.heard_at = -math.inf  # the last line (or metric without a new step) of any rank
        self.first: StackRound | None = None  # the check's first sample, once ended
        self.asked: int | None = None  # the seq of the check's round under way
        self.second_due: float | None = None
        self.working_said = False
        self.unknown_said = False

    def heard(self, now: float) -> None:
        """A rank printed a line, or wrote a metric without a new step: not progress. A due
        check waits for a lull (begins_at); a check under way goes on."""
        self.heard_at = now

    def progressed(self, now: float) -> None:
        """A rank progressed (a new step; a main thread moved; new workers started): the
        next check is due a whole timeout from now, and a check under way is moot."""
        self.quiet_since = now
        self.next_check = now + self.timeout
        self.first, self.asked, self.second_due = None, None, None

    def begins_at(self) -> float:
        """When the due check begins: once no rank has printed for LULL_S, and LULL_S after
        it was due at the latest."""
        return min(max(self.next_check, self.heard_at + LULL_S), self.next_check + LULL_S)

    def waiting(self, now: float) -> bool:
        """Whether `tick` has anything to do: a check is due or under way, no round of it
        is out. Otherwise `tick` changes nothing, and its caller need not read the nodes."""
        if self.timeout <= 0 or self.asked is not None:
            return False
        return self.first is not None or self.second_due is not None or now >= self.begins_at()

    def tick(self, now: float, running: set[int], all_running: bool) -> None:
        """Begin a check, or its second sample, when due. `all_running`: every node runs
        its part and answers (a check while nodes start, end or go silent means nothing)."""
        if self.timeout <= 0 or self.asked is not None:
            return
        if not all_running:
            self.first, self.second_due = None, None
            return
        if self.first is None and now >= self.begins_at():
            self.ask("hang check: first sample", running)
        elif self.second_due is not None and now >= self.second_due:
            self.second_due = None
            self.ask("hang check: second sample", running, flight=True)

    def ask(self, why: str, running: set[int], flight: bool = False) -> None:
        round_ = self.rounds.begin(why, running, flight=flight)
        self.asked = round_.seq if round_ is not None else None

    def round_ended(self, round_: StackRound, now: float) -> Hang | None:
        """A round of stacks ended: the check goes on, or is judged (a Hang, or None)."""
        if round_.seq != self.asked:
            return None
        self.asked = None
        if self.first is None:
            self.first, self.second_due = round_, now + SAMPLE_GAP_S
            return None
        first, self.first = self.first, None
        self.next_check = now + self.timeout
        return self.judge(first, round_, now)

    def said_or_restarted(
        self, hang: Hang, detector: Detector, sessions: Sequence[Sender], now: float
    ) -> bool:
        """Say the hang on the console; then, where torchrun has restarts left
        (--max-restarts), end the stuck ranks (the odd group; every rank where all are
        alike) so that it restarts the workers, and watch the new ones: True. False: the
        run is to end `hung`."""
        for line in hang.console_lines():
            self.note(line)
        used = len(detector.rounds.causes)
        if not detector.max_restarts or used >= detector.max_restarts:
            return False
        stuck = list(hang.stacks.odd) or sorted(detector.ranks)
        on_node: dict[int, list[int]] = {}
        for rank in stuck:
            on_node.setdefault(detector.ranks[rank].node, []).append(rank)
        for session in sessions:
            if session.index in on_node:
                session.send(end_command(on_node[session.index]))
        self.note(
            f"ending {name_ranks(stuck, counted=True)} so that torchrun restarts the workers "
            f"(restart {used + 1} of --max-restarts {detector.max_restarts})"
        )
        self.progressed(now)  # the new workers get a timeout of their own
        return True

    def judge(self, first: StackRound, second: StackRound, now: float) -> Hang | None:
        before = {r.get("rank"): r for r in first.records}
        after = {r.get("rank"): r for r in second.records}
        interval = second.began_wall - first.began_wall
        went = sorted(
            rank
            for rank, record in after.items()
            if rank in before and moved(before[rank], record, interval, CLK_TCK)
        )
        quiet = now - self.quiet_since
        if went:
            self.progressed(now)
            if not self.working_said:
                self.working_said = True
                self.note(
                    f"no new step for {quiet:.0f} s, but the main thread of "
                    f"{name_ranks(went, counted=True)} moved between two samples "
                    f"{interval:.0f} s apart: working"
                )
            return None
        expected = set(self.rounds.hosts)
        if not expected <= before.keys() or not expected <= after.keys():
            return None  # ranks not started yet (or between torchrun's restarts): not a hang
        failed = [r for r in (*before.values(), *after.values()) if r.get("error")]
        if failed or first.missing or second.missing:
            if not self.unknown_said:
                self.unknown_said = True
                self.note(
                    f"no new step and no main thread moved for {quiet:.0f} s; whether the run "
                    "hangs cannot be told: the stacks of some ranks could not be taken "
                    f"(see {second.folder or 'the stacks'})"
                )
            return None
        return self.found(quiet, second)

    def found(self, quiet: float, second: StackRound) -> Hang:
        """The hang, with what the flight recorder dumps of the second sample say."""
        record_dir = self.rounds.record_dir
        if record_dir is None or not (second.dumps or second.not_dumped):
            return Hang(quiet, second)
        try:
            report = collect(record_dir, second.dumps, second.not_dumped)
        except OSError as error:  # a full disk: the stacks still name the stuck ranks
            return Hang(quiet, second, None, (f"flight recorder: not kept: {error}",))
        return Hang(quiet, second, report, tuple(report.lines(self.rounds.hosts)))
