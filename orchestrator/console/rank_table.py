"""What `orchestrator top` shows: every rank of a run, from its record, as it grows.

The record is all it reads (status.json, metrics.jsonl, the rank logs' times), so a run
attached to another terminal, a detached one, a SLURM job followed by its controller and a
run that has ended all look the same. Each row is a rank: its state, its last metrics
(step, loss, samples/s, step time, own work), how long since it last said anything, and
what its processes use (CPU, memory, GPU) from its node's last sample. A rank's metrics
are its latest record, over the window of the bundled trainer's progress lines
(orchestrator/trainer/channel.py): what the console's last line says, for that rank.

Outliers come first: a rank stuck where the hang check found the run hung (the odd group of
its stacks), a failed rank, a named straggler, a rank whose state differs from the others', one
silent much longer than the others, one whose work is well above the median. Every running
rank's silence is a column (`4s`, `2m10s`); a hung run's header says so, with its odd group and
where its stacks are, and once every rank has been quiet over QUIET_SHOWN_S the summary (top's
header, launch's footer) says for how long.

When the rows do not fit the screen, the other ranks fold by node (`r8-15`), and nodes
alike fold together (`ceon[3-17]`), their numbers summed or taken at the worst.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field, replace

from orchestrator.errors import ConfigError
from orchestrator.hostlist import compress_hosts
from orchestrator.record.goodput.phases import is_mark
from orchestrator.record.runs import RunRecord
from orchestrator.record.states import NodePhase, RankPhase, RunState

SLOW_WORK = 1.5  # average work above this times the median: shown first (as stragglers)
SMOOTH = 0.2  # the weight of a rank's newest work in its average (one record a second)
SILENT_RATIO = 3.0  # silence above this times the median (and SILENT_MIN_S): shown first
SILENT_MIN_S = 10.0
BAD_STATES = frozenset({RankPhase.FAILED, RankPhase.KILLED, NodePhase.LOST, RankPhase.UNKNOWN})
STUCK_SEVERITY = 110  # a rank of the hang's odd group: before everything else, failed included
QUIET_SHOWN_S = 30.0  # no rank has said anything for longer: the summary says so


@dataclass
class Row:
    """One rank, or ranks folded together (`count` > 1)."""

    ranks: str  # "12", "8-15"
    host: str
    state: str
    step: int | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    step_s: float | None = None
    work_s: float | None = None
    avg_work_s: float | None = None  # its recent average (the flag compares that)
    silent_s: float | None = None  # since its last output or metrics line
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    gpu_util: float | None = None
    gpu_mem_bytes: int | None = None
    flag: str = ""  # why it is shown first: "straggler: work 2.1x", "failed", ...
    severity: int = 0
    count: int = 1
    rank: int = -1
    node_rank: int = -1


@dataclass
class RunView:
    """A run's record, read on from where the last refresh stopped."""

    record: RunRecord
    status: dict = field(default_factory=dict)
    metrics: dict[int, tuple[float, dict]] = field(default_factory=dict)  # rank -> latest
    samples: dict[int, tuple[float, dict]] = field(default_factory=dict)  # node_rank -> latest
    work: dict[int, float] = field(default_factory=dict)  # rank -> its recent average work
    offset: int = 0
    partial: bytes = b""

    def refresh(self) -> None:
        try:
            self.status = self.record.read_status()
        except ConfigError:  # unreadable for now (a disk error): keep the last one
            pass
        path = self.record.metrics_path
        try:
            with open(path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return
        self.offset += len(data)
        data = self.partial + data
        cut = data.rfind(b"\n") + 1
        self.partial = data[cut:]
        for line in data[:cut].splitlines():
            self._take(line)

    def _take(self, line: bytes) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            return
        if not isinstance(record, dict):
            return
        when = record.get("time")
        if isinstance(record.get("metrics"), dict) and isinstance(record.get("rank"), int):
            rank, metrics = record["rank"], record["metrics"]
            if not is_mark(metrics):  # a start's or a checkpoint's mark: not its figures
                self.metrics[rank] = (when, metrics)
            if (work := _num(metrics.get("work_s"))) is not None:
                before = self.work.get(rank, work)
                self.work[rank] = before + SMOOTH * (work - before)
        elif isinstance(record.get("sample"), dict) and isinstance(record.get("node_rank"), int):
            self.samples[record["node_rank"]] = (when, record["sample"])

    def last_heard(self, rank: int) -> float | None:
        """When the rank last said anything: its log's last write or its last metrics."""
        times = []
        try:
            times.append((self.record.logs_dir / f"rank-{rank}.log").stat().st_mtime)
        except OSError:
            pass
        if rank in self.metrics and isinstance(self.metrics[rank][0], (int, float)):
            times.append(self.metrics[rank][0])
        return max(times) if times else None

    def rank_rows(self, now: float) -> list[Row]:
        rows = []
        stragglers = {s.get("rank"): s for s in self.status.get("stragglers") or []}
        stuck = stuck_ranks(self.status.get("hang"))
        for entry in self.status.get("ranks") or []:
            rank = entry.get("rank")
            if not isinstance(rank, int):
                continue
            row = Row(str(rank), str(entry.get("host", "?")), str(entry.get("state", "?")))
            row.rank, row.node_rank = rank, entry.get("node_rank", -1)
            metrics = self.metrics.get(rank, (None, {}))[1]
            row.step = _int(metrics.get("step"))
            for key in ("loss", "samples_per_s", "step_s", "work_s"):
                setattr(row, key, _num(metrics.get(key)))
            row.avg_work_s = self.work.get(rank)
            heard = self.last_heard(rank) if row.state == RankPhase.RUNNING else None
            row.silent_s = max(0.0, now - heard) if heard is not None else None
            sample = self.samples.get(row.node_rank, (None, {}))[1]
            mine = (sample.get("ranks") or {}).get(str(rank)) or {}
            row.cpu_percent, row.rss_bytes = (
                _num(mine.get("cpu_percent")),
                _int(mine.get("rss_bytes")),
            )
            gpu = next(
                (g for g in sample.get("gpus") or [] if g.get("index") == mine.get("gpu")), None
            )
            if gpu is not None:
                row.gpu_util = _num(gpu.get("util_percent"))
                row.gpu_mem_bytes = _int(mine.get("gpu_mem_bytes"))
            if rank in stragglers:
                s = stragglers[rank]
                row.flag = f"straggler: {s.get('why', '?')} {s.get('ratio', 0):.1f}x"
                row.severity = 90
            if rank in stuck:
                row.flag, row.severity = "stuck", STUCK_SEVERITY
            rows.append(row)
        _mark_outliers(rows)
        return rows

    def rows(self, now: float, room: int | None = None) -> list[Row]:
        """The rows to show, outliers first, folded to fit `room` rows (None: no limit)."""
        rows = self.rank_rows(now)
        outliers = sorted((r for r in rows if r.severity), key=lambda r: (-r.severity, r.rank))
        normal = [r for r in rows if not r.severity]
        if room is None or len(rows) <= room:
            return outliers + normal
        left = max(1, room - len(outliers))
        by_node: dict[int, list[Row]] = {}
        for row in normal:
            by_node.setdefault(row.node_rank, []).append(row)
        folded = [_fold(group, group[0].host) for _, group in sorted(by_node.items())]
        if len(folded) > left:  # nodes alike, together: as many groups as there is room
            size = -(-len(folded) // left)
            folded = [
                _fold(chunk, compress_hosts(r.host for r in chunk))
                for chunk in (folded[i : i + size] for i in range(0, len(folded), size))
            ]
        return outliers[: max(0, room - len(folded))] + folded

    def quiet_s(self, now: float) -> float | None:
        """How long no running rank has said anything (None: none runs, or none was heard)."""
        running = [
            r.get("rank")
            for r in self.status.get("ranks") or []
            if r.get("state") == RankPhase.RUNNING
        ]
        heard = [t for r in running if isinstance(r, int) and (t := self.last_heard(r)) is not None]
        return max(0.0, now - max(heard)) if heard else None

    def header(self, now: float) -> str:
        """The run's summary line and, for a run found hung, what the hang check found."""
        line = f"run {self.record.run_id}: " + summary(self.status, self.metrics, self.quiet_s(now))
        return "\n".join([line, *hang_lines(self.status.get("hang"))])

    def ended(self) -> bool:
        state = RunState.parse(self.status.get("state"))
        return state is not None and state.is_final


def summary(
    status: dict,
    metrics: dict[int, tuple[float, dict]],
    quiet_s: float | None = None,
    check_s: float = 0.0,
) -> str:
    """A run in one line, from its status (as status.json has it) and each rank's latest
    metrics: `running, 16 rank(s) on 4 node(s) (16 running), step 1204, loss 0.4127, 2,421
    samples/s, 1 straggler(s) (rank 6)`. top's header, and launch's footer. The loss is the
    ranks' mean and samples/s their sum: over the same window, the figures of the
    trainer's progress line. `quiet_s`, `check_s`: see quiet_words."""
    ranks = status.get("ranks") or []
    states = Counter(str(r.get("state")) for r in ranks)
    hosts = {r.get("host") for r in ranks}
    latest = [m for _, m in metrics.values()]
    steps = [step for m in latest if (step := _int(m.get("step"))) is not None]
    losses = [loss for m in latest if (loss := _num(m.get("loss"))) is not None]
    rate = sum(_num(m.get("samples_per_s")) or 0.0 for m in latest)
    named = [str(s.get("rank")) for s in status.get("stragglers") or []]
    world = status.get("world") or []  # --min-nodes: the world may differ from the launch's
    launched = len(world[0]["nodes"]) if world else 0
    fewer = f" of the {launched} launched" if launched > len(hosts) else ""
    return (
        f"{status.get('state', '?')}, {len(ranks)} rank(s) on {len(hosts)} node(s){fewer} "
        f"({', '.join(f'{n} {k}' for k, n in sorted(states.items()))})"
        + (f", step {min(steps)}" if steps else "")
        + (f", loss {statistics.fmean(losses):.4f}" if losses else "")
        + (f", {rate:,.0f} samples/s" if rate else "")
        + (f", {len(named)} straggler(s) (rank {', '.join(named[:5])})" if named else "")
        + (f", {words}" if (words := quiet_words(quiet_s, check_s)) else "")
    )


def quiet_words(quiet_s: float | None, check_s: float = 0.0) -> str:
    """`quiet 2m10s (hang check at 5m)` once no rank has said anything for `quiet_s` >
    QUIET_SHOWN_S, else nothing. `check_s`: the silence at which the next hang check begins
    (0: hang checks are off, and the words stop at `quiet 2m10s`)."""
    if quiet_s is None or quiet_s <= QUIET_SHOWN_S:
        return ""
    words = f"quiet {duration(quiet_s)}"
    if not math.isfinite(check_s) or check_s <= 0:
        return words
    if quiet_s < check_s:
        return f"{words} (hang check at {duration(check_s)})"
    return f"{words} (checking for a hang)"


def duration(seconds: float) -> str:
    """A silence, short: `4s`, `2m10s`, `5m`, `1h05m`. Whole seconds, cut down, after
    float noise is rounded off: a difference of two monotonic readings meant as 300 s can
    come out 299.99999999999994 (`(t + 300) - t`), which is 5m, not 4m59s."""
    whole = max(0, int(round(seconds, 6)))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes}m{rest:02d}s" if rest else f"{minutes}m"
    hours, minutes = divmod(whole // 60, 60)
    return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"


def hang_lines(hang: object) -> list[str]:
    """What status.json's `hang` (supervise/hangs.py, Hang.status) says, for top's header:
    for how long no rank moved, the odd group (the first), where every rank's stacks are."""
    if not isinstance(hang, dict):
        return []
    groups = [g for g in hang.get("groups") or [] if isinstance(g, str)]
    quiet = _num(hang.get("quiet_s"))
    lines = [
        f"hung: no rank moved for {'?' if quiet is None else f'{quiet:.0f}'} s; "
        f"first group: {groups[0] if groups else 'no stacks'}"
    ]
    if hang.get("stacks"):
        lines.append(f"stacks of every rank: {hang['stacks']}")
    return lines


def stuck_ranks(hang: object) -> set[int]:
    """The ranks of a hang's odd group, as status.json's `hang` names them."""
    named = hang.get("stuck_ranks") if isinstance(hang, dict) else None
    if not isinstance(named, list):
        return set()
    return {r for r in named if isinstance(r, int) and not isinstance(r, bool)}


def _mark_outliers(rows: list[Row]) -> None:
    """Flag what differs from the other ranks: state, silence, work."""
    if not rows:
        return
    common = Counter(r.state for r in rows).most_common(1)[0][0]
    silences = [r.silent_s for r in rows if r.silent_s is not None and r.state == RankPhase.RUNNING]
    works = [
        r.avg_work_s for r in rows if r.avg_work_s is not None and r.state == RankPhase.RUNNING
    ]
    quiet = statistics.median(silences) if silences else None
    work = statistics.median(works) if works else None
    for row in rows:
        if row.severity:
            continue
        if row.state in BAD_STATES:
            row.flag, row.severity = row.state, 100
        elif row.state != common:
            row.flag, row.severity = row.state, 50
        elif (
            row.state == RankPhase.RUNNING
            and quiet is not None
            and row.silent_s is not None
            and row.silent_s > max(SILENT_MIN_S, SILENT_RATIO * quiet)
        ):
            row.flag, row.severity = f"silent {duration(row.silent_s)}", 40
        elif work and row.avg_work_s is not None and row.avg_work_s > SLOW_WORK * work:
            row.flag, row.severity = f"work {row.avg_work_s / work:.1f}x", 30


def _fold(rows: list[Row], host: str) -> Row:
    """Rows as one: numbers summed (rates, CPU, memory) or the worst (step, times)."""

    def values(key: str) -> list:
        return [v for r in rows if (v := getattr(r, key)) is not None]

    def total(key: str):
        found = values(key)
        return sum(found) if found else None

    def least(key: str):
        found = values(key)
        return min(found) if found else None

    def most(key: str):
        found = values(key)
        return max(found) if found else None

    losses, utils = values("loss"), values("gpu_util")
    states = Counter(r.state for r in rows)
    return replace(
        rows[0],
        ranks=_span(r.ranks for r in rows),
        host=host,
        state=states.most_common(1)[0][0] if len(states) == 1 else "mixed",
        step=least("step"),
        loss=statistics.fmean(losses) if losses else None,
        samples_per_s=total("samples_per_s"),
        step_s=most("step_s"),
        work_s=most("work_s"),
        silent_s=most("silent_s"),
        cpu_percent=total("cpu_percent"),
        rss_bytes=total("rss_bytes"),
        gpu_util=statistics.fmean(utils) if utils else None,
        gpu_mem_bytes=total("gpu_mem_bytes"),
        count=sum(r.count for r in rows),
    )


def _span(labels) -> str:
    """'8', '9-11', '12' -> '8-12' (the first and last rank of folded rows)."""
    numbers = [int(part) for label in labels for part in str(label).split("-")]
    return f"{min(numbers)}-{max(numbers)}" if len(set(numbers)) > 1 else str(numbers[0])


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: object) -> int | None:
    number = _num(value)
    return int(number) if number is not None else None
