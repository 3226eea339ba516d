"""A run's metrics as one picture: runs/<run-id>/metrics.jsonl read into series, drawn with
matplotlib (an optional extra) as four stacked panels: loss per rank over steps, samples/s
per rank over steps, one timeline row per node, and where the wall time went (the run's
goodput, record/goodput/: one bar coloured by phase).

metrics.jsonl holds one JSON object per line, of three kinds: a rank's record (`rank` and
the `metrics` it wrote), a node's sample (`sample`: CPU, memory, GPUs) and an event (`event`:
probe, start, end, failed, lost, restart, straggler, or the run-level stop). The file may be
still being written: a torn last line is ignored; an unparsable line elsewhere is skipped and
counted.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.record.goodput.kept import goodput_of
from orchestrator.record.goodput.phases import PHASES, Goodput, seconds_of
from orchestrator.record.goodput.words import WORDS, duration, percent
from orchestrator.record.runs import RunRecord

LEGEND_RANKS = 16  # beyond this many ranks: thin lines, no per-rank legend
MAX_NODE_LABELS = 40  # timeline rows labelled at most, the others thinned out
MARKS = {  # event -> (marker, colour, label) of its mark on a node's row
    "failed": ("X", "tab:red", "failed"),
    "lost": ("s", "black", "lost"),
    "restart": ("^", "tab:orange", "restart"),
    "straggler": ("D", "tab:purple", "straggler"),
}
WAITING, RUNNING = "#c7c7c7", "tab:green"
PHASE_COLOURS = {  # the goodput panel's colour of each phase
    "waiting": WAITING,
    "starting": "tab:blue",
    "training": RUNNING,
    "redone": "tab:red",
    "checkpoints": "tab:olive",
    "detecting": "tab:purple",
    "stopping": "tab:orange",
    "fewer_nodes": "#98df8a",
    "running": "tab:cyan",
}
UNKNOWN = 1 << 30  # the node rank of a host whose records carry none: after the others


class PlotExtraMissing(ConfigError):
    """matplotlib is not installed: plotting is an optional extra."""

    def __init__(self) -> None:
        super().__init__(
            "plot needs matplotlib, an optional extra: pip install 'orchestrator[plot]' "
            "(or pip install 'matplotlib>=3.7')"
        )


@dataclass
class RankSeries:
    """One rank's reports, by step (a step reported twice, as after a restart from a
    checkpoint, keeps its latest report)."""

    rank: int
    host: str | None = None
    steps: list[int] = field(default_factory=list)
    loss: list[tuple[int, float]] = field(default_factory=list)  # (step, loss)
    samples_per_s: list[tuple[int, float]] = field(default_factory=list)  # (step, samples/s)


@dataclass(frozen=True)
class Event:
    time: float
    host: str | None
    event: str
    detail: str = ""


@dataclass
class RunMetrics:
    """What metrics.jsonl says of a run."""

    run_id: str
    ranks: dict[int, RankSeries]
    events: dict[str, list[Event]]  # host -> its events, in time order
    run_events: list[Event]  # host null: the whole run (stop)
    nodes: list[str]  # every host seen, by node rank, then name
    first_time: float | None
    last_time: float | None
    skipped: int = 0  # unparsable lines skipped (a torn last line not counted)
    world: list[int] = field(default_factory=list)  # nodes per attempt (status.json's world)
    goodput: Goodput | None = None  # where the wall time went (to the run's end, or so far)
    ended: bool = False  # whether the goodput is the ended run's (status.json's `goodput`)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_lines(path: Path) -> tuple[list[dict], int]:
    """The JSON objects of a JSON-lines file, and how many lines were unparsable (not
    counting a torn last line, which a run still being written leaves)."""
    records, bad = [], []
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines = handle.read().split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            bad.append(index)
    skipped = len(bad) - (1 if bad and bad[-1] == len(lines) - 1 else 0)
    return records, skipped


def load(record_path: Path) -> RunMetrics:
    """Read runs/<run-id>/metrics.jsonl into series; ConfigError when it is missing."""
    path = RunRecord(Path(record_path)).metrics_path
    if not path.is_file():
        raise ConfigError(
            f"run {Path(record_path).name} has no {path.name} ({path}): nothing to plot. "
            "Plotting needs the metrics channel: a run launched by an orchestrator version "
            "that has it, whose program reports to it (the bundled trainer does)"
        )
    try:
        records, skipped = read_lines(path)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    run = series_of(Path(record_path).name, records, skipped)
    try:  # the world's sizes over time, where the run changed them (--min-nodes)
        world = RunRecord(Path(record_path)).read_status().get("world") or []
        run.world = [len(entry["nodes"]) for entry in world]
    except (ConfigError, KeyError, TypeError):
        pass  # no status.json, or not one this version writes: the title says no sizes
    run.goodput, run.ended = goodput_so_far(Path(record_path), run.last_time)
    if not run.ranks:
        raise ConfigError(
            f"{path} has no rank's report with a step ({len(records)} records): nothing to "
            "plot. Plotting needs ranks that report to the metrics channel, as the bundled "
            "trainer does"
        )
    return run


def goodput_so_far(record_path: Path, last: float | None) -> tuple[Goodput | None, bool]:
    """The run's goodput as status.json keeps it once the run ended (recomputed to the same
    end, for its timeline); before, up to the record's last line; whether it ended."""
    record = RunRecord(record_path)
    try:
        kept = record.read_status().get("goodput")
    except ConfigError:
        return None, False
    if isinstance(kept, dict):
        return goodput_of(record), True
    return (goodput_of(record, last) if last is not None else None), False


def series_of(run_id: str, records: list[dict], skipped: int = 0) -> RunMetrics:
    """The per-rank series and per-node events of parsed metrics records."""
    by_step: dict[int, dict[int, dict]] = {}
    hosts_of: dict[int, str] = {}
    node_rank: dict[str, int] = {}
    events: dict[str, list[Event]] = {}
    run_events: list[Event] = []
    times: list[float] = []
    for record in records:
        when = record.get("time")
        if is_number(when) and math.isfinite(when):
            times.append(float(when))
        else:
            when = None
        host = record.get("host") if isinstance(record.get("host"), str) else None
        if host is not None:
            rank_of_node = record.get("node_rank")
            known = node_rank.get(host, UNKNOWN)
            node_rank[host] = min(known, int(rank_of_node)) if is_number(rank_of_node) else known
        if "event" in record:
            if when is None or not isinstance(record["event"], str):
                continue
            detail = record.get("detail")
            event = Event(float(when), host, record["event"], "" if detail is None else str(detail))
            (events.setdefault(host, []) if host else run_events).append(event)
        elif "rank" in record and isinstance(record.get("metrics"), dict):
            rank, metrics = record["rank"], record["metrics"]
            if not is_number(rank) or not is_number(metrics.get("step")):
                continue
            by_step.setdefault(int(rank), {})[int(metrics["step"])] = metrics
            if host is not None:
                hosts_of[int(rank)] = host
    ranks = {}
    for rank in sorted(by_step):
        series = RankSeries(rank, hosts_of.get(rank))
        for step in sorted(by_step[rank]):
            metrics = by_step[rank][step]
            series.steps.append(step)
            if is_number(metrics.get("loss")):
                series.loss.append((step, float(metrics["loss"])))
            if is_number(metrics.get("samples_per_s")):
                series.samples_per_s.append((step, float(metrics["samples_per_s"])))
        ranks[rank] = series
    for host_events in events.values():
        host_events.sort(key=lambda e: e.time)
    run_events.sort(key=lambda e: e.time)
    nodes = sorted(node_rank, key=lambda h: (node_rank[h], h))
    return RunMetrics(
        run_id,
        ranks,
        events,
        run_events,
        nodes,
        min(times) if times else None,
        max(times) if times else None,
        skipped,
    )


def spans(events: list[Event], end: float) -> tuple[list[tuple[float, float]], ...]:
    """A node's (waiting, running) spans, (start, end) each: probe -> start is waiting,
    start -> end/failed/lost running; a span still open at the end of the record runs to
    `end` (the run's last record)."""
    waiting, running = [], []
    wait_from = run_from = None
    for event in events:
        if event.event == "probe":
            if run_from is not None:
                running.append((run_from, event.time))
                run_from = None
            wait_from = event.time if wait_from is None else wait_from
        elif event.event == "start":
            if wait_from is not None:
                waiting.append((wait_from, event.time))
                wait_from = None
            run_from = event.time if run_from is None else run_from
        elif event.event in ("end", "failed", "lost"):
            if wait_from is not None:
                waiting.append((wait_from, event.time))
                wait_from = None
            if run_from is not None:
                running.append((run_from, event.time))
                run_from = None
    if wait_from is not None:
        waiting.append((wait_from, max(end, wait_from)))
    if run_from is not None:
        running.append((run_from, max(end, run_from)))
    return waiting, running


def duration_text(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def title_of(run: RunMetrics) -> str:
    nodes = len(run.nodes)
    parts = [
        f"run {run.run_id}",
        f"{len(run.ranks)} rank{'s' if len(run.ranks) != 1 else ''}",
        f"{nodes} node{'s' if nodes != 1 else ''}",
    ]
    if len(set(run.world)) > 1:  # it went on with fewer nodes (--min-nodes), maybe grew back
        parts.append("world " + " \u2192 ".join(map(str, run.world)) + " nodes")
    if run.first_time is not None and run.last_time is not None:
        start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(run.first_time))
        parts.append(f"{start}, {duration_text(run.last_time - run.first_time)}")
    return " \u2014 ".join(parts)


def draw(run: RunMetrics, output: Path) -> Path:
    """Draw the run's three panels into one PNG at `output`; PlotExtraMissing without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotExtraMissing() from None
    rows = max(1, len(run.nodes))
    timeline_height = min(9.0, max(2.0, 0.3 * rows + 1.0))
    figure, (loss_ax, speed_ax, time_ax, goodput_ax) = plt.subplots(
        4,
        1,
        figsize=(12, 8.5 + timeline_height),
        gridspec_kw={"height_ratios": [3.5, 3.5, timeline_height, 1.5]},
        layout="constrained",
    )
    try:
        figure.suptitle(title_of(run), fontsize=12)
        draw_ranks(loss_ax, run, "loss", "loss")
        draw_ranks(speed_ax, run, "samples_per_s", "samples/s")
        draw_timeline(time_ax, run)
        draw_goodput(goodput_ax, run)
        output.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(output, dpi=110)
    except OSError as exc:
        raise OrchestratorError(f"cannot write {output}: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)
    return output


def draw_ranks(ax, run: RunMetrics, key: str, label: str) -> None:
    """One line per rank of `key` (loss, samples_per_s) over steps."""
    import matplotlib

    many = len(run.ranks) > LEGEND_RANKS
    colours = matplotlib.colormaps["viridis" if many else "tab20"]
    drawn = 0
    for index, series in enumerate(run.ranks.values()):
        points = getattr(series, key)
        if not points:
            continue
        steps, values = [p[0] for p in points], [p[1] for p in points]
        if many:
            colour = colours(index / max(1, len(run.ranks) - 1))
            ax.plot(steps, values, color=colour, linewidth=0.6, alpha=0.6)
        else:
            name = f"rank {series.rank}" + (f" ({series.host})" if series.host else "")
            marker = "." if len(points) < 30 else None
            ax.plot(steps, values, color=colours(index % 20), marker=marker, label=name)
        drawn += 1
    ax.set_ylabel(label)
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    if not drawn:
        ax.text(
            0.5,
            0.5,
            f"no rank reported {key}",
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="grey",
        )
        return
    if many:
        ax.set_title(f"{label} per rank: {drawn} ranks (colour: rank, low to high)", fontsize=10)
    else:
        ax.set_title(f"{label} per rank", fontsize=10)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def draw_timeline(ax, run: RunMetrics) -> None:
    """One row per node: waiting (probe -> start) and running (start -> end) spans, marks
    for failed / lost / restart / straggler; a vertical line for a run-level stop or
    restart."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    origin = run.first_time or 0.0
    end = run.last_time or origin
    seen: set[str] = set()
    markersize = 7 if len(run.nodes) <= 32 else 4
    for row, host in enumerate(run.nodes):
        events = run.events.get(host, [])
        waiting, running = spans(events, end)
        for kind, colour, found in (("waiting", WAITING, waiting), ("running", RUNNING, running)):
            if found:
                bars = [(a - origin, b - a) for a, b in found]
                ax.broken_barh(bars, (row - 0.35, 0.7), facecolors=colour, linewidth=0)
                seen.add(kind)
        for event in events:
            if event.event in MARKS:
                marker, colour, _ = MARKS[event.event]
                ax.plot(
                    event.time - origin,
                    row,
                    marker=marker,
                    color=colour,
                    markersize=markersize,
                    linestyle="none",
                )
                seen.add(event.event)
    for event in run.run_events:  # the whole run's: a vertical line across every row
        if event.event == "stop":
            ax.axvline(event.time - origin, color="tab:red", linestyle="--", linewidth=1.2)
            seen.add("stop")
        elif event.event == "restart":
            ax.axvline(event.time - origin, color="tab:orange", linestyle=":", linewidth=1.2)
            seen.add("run restart")
    rows = len(run.nodes)
    ax.set_ylim(rows - 0.5 if rows else 0.5, -0.5)  # node rank 0 on top
    step = max(1, math.ceil(rows / MAX_NODE_LABELS))
    ax.set_yticks(range(0, rows, step))
    ax.set_yticklabels([run.nodes[i] for i in range(0, rows, step)], fontsize=8)
    ax.set_xlim(0, max(1.0, end - origin) * 1.02)
    ax.set_xlabel("seconds since the run's first record")
    thinned = f" ({rows}; one in {step} labelled)" if step > 1 else ""
    ax.set_title(f"nodes{thinned}", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    if not seen:
        ax.text(
            0.5,
            0.5,
            "no node events",
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="grey",
        )
    handles = []
    if "waiting" in seen:
        handles.append(Patch(color=WAITING, label="waiting (probe \u2192 start)"))
    if "running" in seen:
        handles.append(Patch(color=RUNNING, label="running (start \u2192 end)"))
    for name, (marker, colour, label) in MARKS.items():
        if name in seen:
            handles.append(
                Line2D([], [], marker=marker, color=colour, linestyle="none", label=label)
            )
    if "stop" in seen:
        handles.append(Line2D([], [], color="tab:red", linestyle="--", label="run stopped"))
    if "run restart" in seen:
        handles.append(Line2D([], [], color="tab:orange", linestyle=":", label="run restarted"))
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def draw_goodput(ax, run: RunMetrics) -> None:
    """The wall time as one bar, each stretch coloured by its phase (record/goodput/), with
    the seconds of each phase in the legend; a line between attempts."""
    from matplotlib.patches import Patch

    goodput = run.goodput
    ax.set_yticks([])
    ax.set_xlabel("seconds since the run's start")
    if goodput is None:
        ax.set_title("where the wall time went: not known (no status.json)", fontsize=10)
        return
    origin = goodput.started
    for phase in PHASES:
        bars = [(a - origin, b - a) for a, b, name in goodput.timeline if name == phase]
        if bars:
            ax.broken_barh(bars, (0, 1), facecolors=PHASE_COLOURS[phase], linewidth=0)
    for attempt in goodput.attempts[1:]:
        begun = seconds_since(attempt["from"], origin)
        if begun is not None:
            ax.axvline(begun, color="black", linewidth=1.0)
    ax.set_xlim(0, max(1.0, goodput.wall) * 1.02)
    ax.set_ylim(0, 1)
    said = f"goodput {percent(goodput.ratio)}" if goodput.steps else "no steps reported"
    when = "" if run.ended else " so far"
    ax.set_title(f"where the wall time went{when}: {said} (training kept / wall)", fontsize=10)
    handles = [
        Patch(color=PHASE_COLOURS[name], label=f"{WORDS[name]} {duration(seconds)}")
        for name, seconds in goodput.phases.items()
        if seconds >= 0.05
    ]
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def seconds_since(stamp: str, origin: float) -> float | None:
    when = seconds_of(stamp)
    return None if when is None else when - origin
