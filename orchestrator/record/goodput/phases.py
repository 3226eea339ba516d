"""Where a run's wall time went: its goodput, from what the run record holds, as pure
functions over plain data (status.json's document, metrics.jsonl's records).

The wall time, from status.json's `started_at` to the run's end (the moment its last line
is said), is cut into phases that add up to it exactly, per attempt and in total. An
attempt is one entry of status.json's `world` over SSH (from its `since`: when it was
planned) or of its `attempts` under SLURM (from its `submitted_at`); the first begins at the
run's start, each ends where the next begins, the last at the run's end. Times are the
controller's clock: a rank's own `time` is put into it by the smallest gap its host's
records show between arrival and writing (NTP's minimum-delay idea).

waiting      SLURM's queue (an attempt's `submitted_at` to its `running_at`) and the preflight
             probes (each node's `probe` event: when it began, for as long as its detail
             says), wherever no training runs.
starting     the rest of an attempt up to its first step: connecting, syncing, the agents'
             and torchrun's start, the program's own set-up; after a restart within an
             attempt (--max-restarts), from the failure to the next first step.
training     steps whose work was kept: from the start of a stint's training (its
             `from_step` mark, else its first record's `time` less `steps` x `step_s`) to
             its last record, less the saves and the redone steps. A stint is an
             attempt's training (its records of steps and its marks), or the part of it
             between two `restart` events.
redone       steps done again: a stint's steps beyond the step a later stint began from
             (its `from_step` mark, else its first record's `step` less `steps`), from
             when that step was done (its checkpoint mark's `time` less `save_s`, else by
             the records around it) to the stint's last record.
checkpoints  saves: each `checkpoint` record of a rank, `save_s` seconds up to its `time`.
detecting    from a stint's last record to the `failed` or `lost` event that ended it, or
             where none did, to when the launcher saw a node fault end the attempt (a
             SLURM job that ended NODE_FAIL: its attempt's `ended_at`; a node a spare
             replaced: its recovery's `noticed_at`).
stopping     from that event (or, with no fault, from the last record) to the attempt's
             end: the other nodes stopped, the program's own end, a spare probed, a job
             submitted again.
fewer_nodes  the share of the training that the nodes left out did not do: training on n
             of the N nodes launched with counts n/N as training, the rest here.
running      only for a program that reports no steps (no metrics channel): from its
             attempt's first node `start` event to its fault (or its last node's `end`);
             its training and what it redid cannot be told apart, and `steps` says False.

The effective training time ratio (`ratio`) is training / wall. A fault's cost (`faults`):
its detecting, its restart (from the fault to the next stint's first step) and the redone
training before it. The metrics channel's two marks, written by the bundled trainer (a
record without `step`): {"from_step": step, "time": ...} as training begins after `step`
completed steps (0, or the checkpoint it resumed from), and {"checkpoint": step, "save_s":
seconds, "time": ...} after a save.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from orchestrator.record.older_names import job_attempts
from orchestrator.record.runs import now_iso

PHASES = (
    "waiting",
    "starting",
    "training",
    "redone",
    "checkpoints",
    "detecting",
    "stopping",
    "fewer_nodes",
    "running",
)
MARK_KEYS = ("checkpoint", "from_step")  # a metrics record that marks, not a step
NO_STEPS = (
    "the program reported no steps (no metrics channel): training, redone steps, saves and "
    "detection cannot be told apart, and are `running`"
)
# "node-failure": a scheduler's word (Attempt.fault_at); "swap": a slow node taken out at a
# checkpoint (supervise/straggler_swap.py), an attempt's end as a fault is, detected at once
FAULTS = ("failed", "lost", "node-failure", "swap")


def is_mark(metrics: dict) -> bool:
    """A rank's record that marks a checkpoint or a resume rather than reporting steps."""
    return "step" not in metrics and any(key in metrics for key in MARK_KEYS)


@dataclass(frozen=True)
class Attempt:
    """One attempt's place in the run: when it began and on how many nodes."""

    number: int
    began: float
    nodes: int
    queued: tuple[float, float] | None = None  # SLURM: submitted -> running
    fault_at: float | None = None  # a node fault ended it, seen then (no event may say so)


@dataclass(frozen=True)
class Inputs:
    """What the computation reads, taken from the record (see `inputs_of`)."""

    started: float
    attempts: tuple[Attempt, ...]
    launched: int  # the nodes of the first attempt
    records: tuple[dict, ...]  # metrics.jsonl, as written


@dataclass
class Stint:
    """A stretch of training: its records' (time, step), its first step's start, its saves."""

    first: float  # the first step's start
    last: float  # its last record
    start_step: int
    points: list[tuple[float, int]]  # (time, step) of its records, by time
    saves: list[tuple[float, float, int]]  # (began, ended, step saved)
    kept_until: int | None = None  # the step a later stint resumed from (None: all kept)

    @property
    def end_step(self) -> int:
        return max(step for _, step in self.points)

    def done_at(self, step: int) -> float:
        """When the stint had done `step`: its save of it began then, else by its records."""
        for began, _, saved in self.saves:
            if saved == step:
                return began
        before = [(t, s) for t, s in self.points if s <= step]
        after = [(t, s) for t, s in self.points if s >= step]
        if not before:
            return self.first
        if not after:
            return self.last
        (t0, s0), (t1, s1) = before[-1], after[0]
        return t0 if s1 == s0 else t0 + (t1 - t0) * (step - s0) / (s1 - s0)


@dataclass
class Goodput:
    """The phases of the whole run and of each attempt (seconds), and what faults cost."""

    started: float
    ended: float
    steps: bool  # whether the program reported steps
    phases: dict[str, float]
    attempts: list[dict]
    redone_steps: int
    faults: list[Fault]
    timeline: list[tuple[float, float, str]]  # (from, to, phase), covering the wall time

    @property
    def wall(self) -> float:
        return self.ended - self.started

    @property
    def ratio(self) -> float:
        return self.phases["training"] / self.wall if self.wall > 0 else 0.0

    def to_dict(self) -> dict:
        """status.json's `goodput`."""
        fault_sum = {
            key: round(sum(getattr(f, key) for f in self.faults), 3)
            for key in ("detect_s", "restart_s", "redone_s")
        }
        return {
            "from": now_iso(self.started),
            "to": now_iso(self.ended),
            "wall_s": round(self.wall, 3),
            "ratio": round(self.ratio, 4),
            "steps": self.steps,
            "phases": rounded(self.phases),
            "redone_steps": self.redone_steps,
            "faults": {
                "count": len(self.faults),
                **fault_sum,
                "each": [fault.to_dict() for fault in self.faults],
            },
            "attempts": self.attempts,
            **({} if self.steps else {"note": NO_STEPS}),
        }


def seconds_of(stamp: object) -> float | None:
    """An ISO time of status.json in seconds, or None where it is not one."""
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def rounded(phases: dict[str, float]) -> dict[str, float]:
    return {name: round(phases.get(name, 0.0), 3) for name in PHASES}


def number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def inputs_of(status: dict, records: Iterable[dict]) -> Inputs | None:
    """The attempts status.json names (SLURM's `attempts`, else the SSH world), and the
    records; None when status.json has no start time."""
    started = seconds_of(status.get("started_at"))
    if started is None:
        return None
    world = [w for w in status.get("world") or [] if isinstance(w, dict)]
    sizes = {w.get("attempt"): len(w.get("nodes") or []) for w in world}
    attempts = []
    for job in job_attempts(status):
        if not isinstance(job, dict):
            continue
        number_ = job.get("attempt") or len(attempts) + 1
        began = seconds_of(job.get("submitted_at")) or started
        running = seconds_of(job.get("running_at"))
        nodes = sizes.get(number_) or job.get("nodes") or status.get("nnodes") or 1
        failed = seconds_of(job.get("ended_at")) if job.get("ended") == "node-failure" else None
        queued = (began, running) if running else None
        attempts.append(Attempt(number_, began, nodes, queued, failed))
    if not attempts:
        for entry in world:
            began = seconds_of(entry.get("since")) or started
            number_, nodes = (
                entry.get("attempt") or len(attempts) + 1,
                len(entry.get("nodes") or []),
            )
            attempts.append(Attempt(number_, began, nodes))
    if not attempts:
        attempts = [Attempt(1, started, int(status.get("nnodes") or 1))]
    for recovery in status.get("recoveries") or []:  # a spare replaced a node of the one before
        noticed = seconds_of(recovery.get("noticed_at")) if isinstance(recovery, dict) else None
        for index, attempt in enumerate(attempts):
            if noticed is not None and attempt.number == recovery.get("attempt", 0) - 1:
                seen = min(noticed, attempt.fault_at or noticed)
                attempts[index] = Attempt(
                    attempt.number, attempt.began, attempt.nodes, attempt.queued, seen
                )
    launched = attempts[0].nodes or 1
    return Inputs(
        started, tuple(attempts), launched, tuple(r for r in records if isinstance(r, dict))
    )


# --- the record's times ---------------------------------------------------------------


def offsets(records: Sequence[dict]) -> dict[object, float]:
    """host -> the gap to add to its ranks' own times to put them in the controller's clock."""
    found: dict[object, float] = {}
    for record in records:
        metrics = record.get("metrics")
        if not isinstance(metrics, dict) or not number(record.get("time")):
            continue
        if number(metrics.get("time")):
            gap = record["time"] - metrics["time"]
            found[record.get("host")] = min(found.get(record.get("host"), gap), gap)
    return found


def rank_time(record: dict, gaps: dict[object, float]) -> float:
    """When a rank wrote its record, in the controller's clock."""
    own = record["metrics"].get("time")
    if number(own) and record.get("host") in gaps:
        return min(record["time"], own + gaps[record["host"]])
    return record["time"]


def events_of(records: Sequence[dict]) -> list[tuple[float, str, str]]:
    """(time, kind, detail) of every event, by time."""
    return sorted(
        (r["time"], r["event"], str(r.get("detail") or ""))
        for r in records
        if isinstance(r.get("event"), str) and number(r.get("time"))
    )


def waits(inputs: Inputs, events: Sequence[tuple[float, str, str]]) -> list[tuple[float, float]]:
    """SLURM's queue and the preflight probes, as (from, to)."""
    found = [a.queued for a in inputs.attempts if a.queued is not None]
    for when, kind, detail in events:
        if kind == "probe":
            try:
                lasted = float(detail.split()[0])
            except (ValueError, IndexError):
                continue
            found.append((when, when + lasted))
    return found


def stints_of(
    records: Sequence[dict], gaps: dict, restarts: Sequence[float], begin: float, end: float
) -> list[Stint]:
    """The training of one attempt's span, cut at its restart events."""
    cuts = [begin, *sorted(t for t in restarts if begin < t < end), end]
    found = (stint_of(records, gaps, lo, hi) for lo, hi in itertools.pairwise(cuts))
    return [stint for stint in found if stint is not None]


def stint_of(records: Sequence[dict], gaps: dict, lo: float, hi: float) -> Stint | None:
    """The stint of the records written in [lo, hi), if any says where training was: a
    record of steps, or a mark (the step a save or a start came after is done)."""
    points: list[tuple[float, int]] = []
    firsts: dict[object, tuple[float, int]] = {}  # rank -> (its first step's start, step before)
    saves: list[tuple[float, float, int]] = []
    begun: list[tuple[float, int]] = []  # from_step marks: (when, the step before)
    for record in records:
        metrics = record.get("metrics")
        if not isinstance(metrics, dict) or not number(record.get("time")):
            continue
        when = rank_time(record, gaps)
        if not lo <= when < hi:
            continue
        step = metrics.get("step")
        if type(step) is int:
            points.append((when, step))
            steps, step_s = metrics.get("steps"), metrics.get("step_s")
            count = steps if type(steps) is int and steps > 0 else 1
            began = when - count * step_s if number(step_s) else when
            firsts.setdefault(record.get("rank"), (max(lo, began), step - count))
        elif type(metrics.get("checkpoint")) is int:
            save_s = metrics.get("save_s")
            began = max(lo, when - (save_s if number(save_s) else 0.0))
            saves.append((began, when, metrics["checkpoint"]))
            points.append((began, metrics["checkpoint"]))
        elif type(metrics.get("from_step")) is int:
            begun.append((when, metrics["from_step"]))
            points.append((when, metrics["from_step"]))
    if not points:
        return None
    points.sort()
    starts = [*(start for start, _ in firsts.values()), *(when for when, _ in begun)]
    first = min(starts or [points[0][0]])
    last = max([points[-1][0], *(ended for _, ended, _ in saves)])
    start_step = min(step for _, step in (begun or firsts.values() or points))
    saves = sorted((max(a, first), b, step) for a, b, step in saves if b > first)
    return Stint(first, last, start_step, points, saves)


# --- painting the wall time ------------------------------------------------------------


def paint(spans: Sequence[tuple[float, float, str]], lo: float, hi: float) -> list:
    """The wall time [lo, hi] as (from, to, phase): where spans overlap, the later wins."""
    bounds = sorted({lo, hi, *(max(lo, min(hi, t)) for a, b, _ in spans for t in (a, b))})
    starts = sorted(
        (max(lo, a), -order, min(hi, b), name) for order, (a, b, name) in enumerate(spans) if b > a
    )
    heap: list[tuple[int, float, str]] = []
    out: list[tuple[float, float, str]] = []
    index = 0
    for left, right in itertools.pairwise(bounds):
        while index < len(starts) and starts[index][0] <= left:
            _, order, b, name = starts[index]
            heapq.heappush(heap, (order, b, name))
            index += 1
        while heap and heap[0][1] <= left:
            heapq.heappop(heap)
        if not heap:  # each attempt paints its whole span first: never bare
            continue
        name = heap[0][2]
        if out and out[-1][2] == name and out[-1][1] == left:
            out[-1] = (out[-1][0], right, name)
        else:
            out.append((left, right, name))
    return out


@dataclass
class Fault:
    """A failed or lost event that ended a stint (or an attempt without steps)."""

    at: float
    event: str
    detect_s: float
    stint: Stint | None
    restart_s: float = 0.0  # to the next stint's first step (no steps: its first node start)
    redone_s: float = 0.0

    def to_dict(self) -> dict:
        return {
            "event": self.event,
            "detect_s": round(self.detect_s, 3),
            "restart_s": round(self.restart_s, 3),
            "redone_s": round(self.redone_s, 3),
        }


def attempt_spans(
    begin: float,
    end: float,
    stints: list[Stint],
    own: Sequence[tuple[float, str, str]],
    measured: bool,
) -> tuple[list[tuple[float, float, str]], list[Fault], list[float]]:
    """An attempt's spans but the training's (starting, running, detecting, stopping), its
    faults, and when a restart after a fault before it ended (its first step; without
    steps, its first node start); `own`: its events, by time."""
    spans = [(begin, end, "starting")]
    if not stints:
        starts = [t for t, kind, _ in own if kind == "start"]
        run_from = min(starts) if starts and not measured else None
        fault = next((e for e in own if e[1] in FAULTS and (run_from or begin) <= e[0]), None)
        ended = [t for t, kind, _ in own if kind == "end" and (run_from or begin) <= t]
        if run_from is not None:
            spans.append((run_from, fault[0] if fault else max(ended, default=end), "running"))
        if fault is None:
            if run_from is not None and ended:
                spans.append((max(ended), end, "stopping"))
            return spans, [], starts[:1] if not measured else []
        spans.append((fault[0], end, "stopping"))
        return spans, [Fault(fault[0], fault[1], 0.0, None)], starts[:1] if not measured else []
    faults = []
    for index, stint in enumerate(stints):
        upto = stints[index + 1].first if index + 1 < len(stints) else end
        ending = [e for e in own if e[1] in FAULTS and stint.first <= e[0] < upto]
        if index + 1 == len(stints):
            spans.append((stint.last, end, "stopping"))
        if ending:  # the first after its last record; one said before it came is its end too
            after = [e for e in ending if e[0] >= stint.last]
            when, kind, _ = after[0] if after else ending[0]
            at = max(when, stint.last)
            spans.append((stint.last, at, "detecting"))
            if index + 1 == len(stints):
                spans.append((at, end, "stopping"))
            faults.append(Fault(at, kind, at - stint.last, stint))
    return spans, faults, [stint.first for stint in stints]


def compute(inputs: Inputs, ended: float) -> Goodput:
    """The run's goodput from its start to `ended` (see the module's docstring)."""
    records, events = inputs.records, events_of(inputs.records)
    gaps, attempts = offsets(records), list(inputs.attempts)
    begins = [inputs.started] + [a.began for a in attempts[1:]]
    ends = [a.began for a in attempts[1:]] + [ended]
    restarts = [t for t, kind, _ in events if kind == "restart"]
    spans_of = zip(begins, ends, strict=True)
    by_attempt = [stints_of(records, gaps, restarts, b, e) for b, e in spans_of]
    every = [s for stints in by_attempt for s in stints]
    for index, stint in enumerate(every):  # the lowest step any later stint resumed from
        later = [s.start_step for s in every[index + 1 :]]
        stint.kept_until = min(later) if later else None
    measured = bool(every)
    spans: list[tuple[float, float, str]] = []
    faults: list[Fault] = []
    firsts: list[float] = []
    for attempt, begin, end, stints in zip(attempts, begins, ends, by_attempt, strict=True):
        own = [e for e in events if begin <= e[0] < end]
        if attempt.fault_at is not None and not any(e[1] in FAULTS for e in own):
            own = sorted([*own, (min(max(attempt.fault_at, begin), end), "node-failure", "")])
        own_spans, own_faults, own_firsts = attempt_spans(begin, end, stints, own, measured)
        spans, faults, firsts = spans + own_spans, faults + own_faults, firsts + own_firsts
    for fault in faults:  # its restart ends at the next first step (the run's end: none)
        fault.restart_s = min((f - fault.at for f in firsts if f >= fault.at), default=0.0)
    spans += [(a, b, "waiting") for a, b in waits(inputs, events)]
    redone_steps = 0
    for stint in every:
        cut = stint.last
        if stint.kept_until is not None and stint.kept_until < stint.end_step:
            kept_to = max(stint.kept_until, stint.start_step)
            cut = max(stint.first, min(stint.last, stint.done_at(kept_to)))
            redone_steps += stint.end_step - kept_to
        spans += [(stint.first, cut, "training"), (cut, stint.last, "redone")]
        spans += [(a, b, "checkpoints") for a, b, _ in stint.saves]
    timeline = paint(spans, inputs.started, ended)
    for fault in faults:
        if fault.stint is not None:
            fault.redone_s = sum(
                min(b, fault.stint.last) - max(a, fault.stint.first)
                for a, b, name in timeline
                if name == "redone" and a < fault.stint.last and b > fault.stint.first
            )
    total = {name: 0.0 for name in PHASES}
    per_attempt = []
    for attempt, begin, end, stints in zip(attempts, begins, ends, by_attempt, strict=True):
        phases = phases_in(timeline, begin, end)
        share = min(1.0, attempt.nodes / inputs.launched) if attempt.nodes else 1.0
        for kind in ("training", "running"):
            phases["fewer_nodes"] += phases[kind] * (1 - share)
            phases[kind] *= share
        for name in PHASES:
            total[name] += phases[name]
        per_attempt.append(
            {
                "attempt": attempt.number,
                "nodes": attempt.nodes,
                "from": now_iso(begin),
                "wall_s": round(end - begin, 3),
                "phases": rounded(phases),
                "steps": [stints[0].start_step, stints[-1].end_step] if stints else None,
            }
        )
    return Goodput(
        inputs.started, ended, measured, total, per_attempt, redone_steps, faults, timeline
    )


def phases_in(timeline: Sequence[tuple[float, float, str]], begin: float, end: float) -> dict:
    """Seconds of each phase of `timeline` within [begin, end]."""
    phases = {name: 0.0 for name in PHASES}
    for a, b, name in timeline:
        lo, hi = max(a, begin), min(b, end)
        if hi > lo:
            phases[name] += hi - lo
    return phases
