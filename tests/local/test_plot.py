"""`orchestrator plot`: runs/<run-id>/metrics.jsonl read into per-rank series and per-node
events, and drawn as one PNG; its errors (no metrics, no matplotlib) as messages, exit 2."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.console.plot import Event, draw, load, read_lines, series_of, spans, title_of
from orchestrator.record.goodput.kept import close
from orchestrator.record.runs import now_iso
from tests.cli_helpers import REPO, run_cli

T0 = 1764094400.0
PNG = b"\x89PNG\r\n\x1a\n"


def make_records(
    nodes: int = 2,
    per_node: int = 2,
    steps: int = 200,
    *,
    every: int = 10,
    restart_at: int | None = None,
    lost_node: int | None = None,
    straggler: int | None = None,
    stop: bool = False,
    seed: int = 0,
) -> list[dict]:
    """The records a controller appends to metrics.jsonl for a run of `nodes` nodes with
    `per_node` ranks each, reporting every `every` steps up to `steps`; optionally a
    restart (from a checkpoint `every * 3` steps back) at step `restart_at` after node
    `lost_node` is lost, a straggler rank, and a run-level stop at the end."""
    rng = random.Random(seed)
    hosts = [f"node{i}" for i in range(nodes)]
    out: list[dict] = []

    def event(when, host, name, detail=""):
        node_rank = None if host is None else hosts.index(host)
        out.append(
            {"time": when, "host": host, "node_rank": node_rank, "event": name, "detail": detail}
        )

    def begin(at: float) -> float:
        for i, host in enumerate(hosts):
            event(at + 0.05 * i, host, "probe")
        for i, host in enumerate(hosts):
            event(at + 3.0 + 0.1 * i + rng.random(), host, "start")
        return at + 5.0

    def train(now: float, first: int, last: int) -> float:
        for step in range(first, last + 1, every):
            now += every * 0.04
            for rank in range(nodes * per_node):
                slow = 0.6 if rank == straggler else 1.0
                loss = 2.5 * math.exp(-step / 300) + 0.3 + rng.gauss(0, 0.03)
                speed = 800.0 * slow + rng.gauss(0, 15)
                metrics = {"step": step, "loss": round(loss, 4), "samples_per_s": round(speed, 1)}
                metrics.update(step_s=0.04, data_wait_s=0.002, work_s=0.031, sync_s=0.006)
                metrics.update(steps=every, time=now)
                host = hosts[rank // per_node]
                out.append(
                    {
                        "time": now + rng.random() * 0.01,
                        "host": host,
                        "node_rank": rank // per_node,
                        "rank": rank,
                        "metrics": metrics,
                    }
                )
            if step % (every * 5) == 0:
                for i, host in enumerate(hosts):
                    sample = {"cpu_percent": 180.0, "rss_bytes": 2 << 30, "ranks": {}}
                    sample["gpus"] = [{"index": 0, "util_percent": 95, "temp_c": 60}]
                    out.append({"time": now, "host": host, "node_rank": i, "sample": sample})
            if straggler is not None and step == first + every * 4:
                event(now, hosts[straggler // per_node], "straggler", f"rank {straggler}")
        return now

    now = begin(T0)
    if restart_at is not None:
        now = train(now, every, restart_at)
        if lost_node is not None:
            event(now + 1, hosts[lost_node], "lost", "no heartbeat for 30 s")
        event(now + 2, None, "restart", "restart 1 of 3")
        now = begin(now + 3)
        now = train(now, restart_at - every * 3, steps)
    else:
        now = train(now, every, steps)
    if stop:
        event(now + 0.5, None, "stop", "stopped by the user")
    for i, host in enumerate(hosts):
        event(now + 1 + 0.1 * i, host, "end", "exit code 0")
    return out


def write_run(run_dir: Path, run_id: str, records: list[dict], *, bad: int = 0, torn=True) -> Path:
    """A run folder with status.json and metrics.jsonl: `bad` garbage lines among the
    records and, with `torn`, a last line cut in half."""
    folder = run_dir / run_id
    (folder / "logs").mkdir(parents=True)
    (folder / "status.json").write_text(json.dumps({"state": "running"}), encoding="utf-8")
    lines = [json.dumps(r) for r in records]
    for k in range(bad):
        lines.insert((k + 1) * len(lines) // (bad + 1), '{"time": 17640944')
    text = "\n".join(lines) + "\n"
    if torn:
        text += json.dumps(records[-1])[:25]
    (folder / "metrics.jsonl").write_text(text, encoding="utf-8")
    return folder


def test_series_are_the_files_values_in_step_order(tmp_path) -> None:
    records = make_records(nodes=3, per_node=2, steps=120, straggler=3, stop=True)
    shuffled = records[:]
    random.Random(1).shuffle(shuffled)  # file order is not step order
    shuffled.append({"time": T0, "host": "node0", "node_rank": 0, "rank": 0, "metrics": {}})
    shuffled.append(
        {"time": T0, "host": "node0", "node_rank": 0, "rank": 1, "metrics": {"step": "x"}}
    )
    folder = write_run(tmp_path, "r1", shuffled, bad=2)
    run = load(folder)
    assert run.skipped == 2  # the torn last line is not counted
    assert sorted(run.ranks) == list(range(6))
    assert run.nodes == ["node0", "node1", "node2"]
    for rank, series in run.ranks.items():
        mine = sorted(
            (r["metrics"] for r in records if r.get("rank") == rank), key=lambda m: m["step"]
        )
        assert series.steps == [m["step"] for m in mine]
        assert [v for _, v in series.loss] == [m["loss"] for m in mine]
        assert [v for _, v in series.samples_per_s] == [m["samples_per_s"] for m in mine]
        assert series.host == f"node{rank // 2}"
    assert [e.event for e in run.events["node1"]] == ["probe", "start", "straggler", "end"]
    assert run.events["node1"][2].detail == "rank 3"
    assert [e.event for e in run.run_events] == ["stop"]
    times = [r["time"] for r in records]
    assert (run.first_time, run.last_time) == (min(times), max(times))


def test_missing_or_odd_metrics_are_left_out() -> None:
    def rank(step, **metrics):
        return {"time": T0 + step, "host": "a", "node_rank": 0, "rank": 0,
                "metrics": {"step": step, **metrics}}  # fmt: skip

    records = [
        rank(1, loss=1.0),
        rank(2, samples_per_s=10.0),
        rank(3, loss="nan?", samples_per_s=True),
        rank(4, loss=0.5, samples_per_s=20),
        rank(2, loss=0.9, samples_per_s=11.0),  # step 2 again (a restart): the latest wins
    ]
    series = series_of("r", records).ranks[0]
    assert series.steps == [1, 2, 3, 4]
    assert series.loss == [(1, 1.0), (2, 0.9), (4, 0.5)]
    assert series.samples_per_s == [(2, 11.0), (4, 20.0)]


def test_torn_last_line_is_ignored_and_others_counted(tmp_path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\nnot json\n[1]\n{"b": 2}\n{"c": ', encoding="utf-8")
    records, skipped = read_lines(path)
    assert records == [{"a": 1}, {"b": 2}]
    assert skipped == 2


def test_node_spans_follow_probe_start_end() -> None:
    events = [
        Event(0.0, "a", "probe"),
        Event(2.0, "a", "start"),
        Event(5.0, "a", "straggler", "rank 1"),
        Event(9.0, "a", "failed", "exit code 1"),
        Event(10.0, "a", "probe"),
        Event(11.0, "a", "start"),
    ]
    waiting, running = spans(events, end=20.0)
    assert waiting == [(0.0, 2.0), (10.0, 11.0)]
    assert running == [(2.0, 9.0), (11.0, 20.0)]  # still running at the record's end


def test_plot_writes_a_png_into_the_run_folder(tmp_path) -> None:
    records = make_records(nodes=2, per_node=2, steps=100, restart_at=60, lost_node=1)
    folder = write_run(tmp_path, "r1", records, bad=1)
    done = run_cli(["plot", "r1", "--run-dir", str(tmp_path)], cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(folder / "plot.png")
    assert (
        done.stderr.strip() == f"warning: 1 unparsable line in {folder / 'metrics.jsonl'} skipped"
    )
    assert_png(folder / "plot.png")


def test_plot_output_option(tmp_path) -> None:
    write_run(tmp_path, "r1", make_records(nodes=1, per_node=1, steps=50), torn=False)
    target = tmp_path / "out" / "run.png"
    done = run_cli(["plot", "r1", "--run-dir", str(tmp_path), "-o", str(target)], cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(target)
    assert done.stderr == ""
    assert_png(target)


def test_many_ranks_and_nodes_draw(tmp_path) -> None:
    records = make_records(nodes=64, per_node=4, steps=60, straggler=7, stop=True)
    folder = write_run(tmp_path, "big", records)
    image = assert_png(draw(load(folder), tmp_path / "big.png"))
    assert image.shape[0] > 1000  # the timeline grows with the nodes


def test_missing_matplotlib_is_a_message(tmp_path) -> None:
    write_run(tmp_path, "r1", make_records(nodes=1, per_node=1, steps=30))
    shim = (
        "import sys; sys.modules['matplotlib'] = None; "
        "from orchestrator.cli import main; main(sys.argv[1:])"
    )
    done = subprocess.run(
        [sys.executable, "-c", shim, "plot", "r1", "--run-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "orchestrator: error: plot needs matplotlib" in done.stderr
    assert "pip install 'orchestrator[plot]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "r1" / "plot.png").exists()


def test_no_metrics_is_a_message(tmp_path) -> None:
    folder = write_run(tmp_path, "r1", make_records(nodes=1, per_node=1, steps=30))
    (folder / "metrics.jsonl").unlink()
    done = run_cli(["plot", "r1", "--run-dir", str(tmp_path)], cwd=REPO)
    assert done.returncode == 2
    assert "has no metrics.jsonl" in done.stderr
    assert "metrics channel" in done.stderr
    assert "Traceback" not in done.stderr


def test_no_step_is_a_message(tmp_path) -> None:
    only_events = [r for r in make_records(nodes=2, per_node=1, steps=30) if "rank" not in r]
    write_run(tmp_path, "r1", only_events)
    done = run_cli(["plot", "r1", "--run-dir", str(tmp_path)], cwd=REPO)
    assert done.returncode == 2
    assert "no rank's report with a step" in done.stderr
    assert "metrics channel" in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_run_is_a_message(tmp_path) -> None:
    done = run_cli(["plot", "nope", "--run-dir", str(tmp_path)], cwd=REPO)
    assert done.returncode == 2
    assert "no run 'nope'" in done.stderr


def assert_png(path: Path):
    image = pytest.importorskip("matplotlib.image").imread(path)
    assert path.read_bytes()[:8] == PNG
    assert image.shape[0] > 500 and image.shape[1] > 800
    assert image.std() > 0.05  # something was drawn
    return image


def test_the_title_shows_the_world_sizes_of_a_run_that_changed_them(tmp_path) -> None:
    folder = write_run(tmp_path, "r9", make_records(nodes=4, per_node=1, steps=10))
    world = [{"nodes": ["n0", "n1", "n2", "n3"]}, {"nodes": ["n1", "n2", "n3"]}]
    assert "world" not in title_of(load(folder))  # no world in status.json
    (folder / "status.json").write_text(json.dumps({"world": world + world[:1]}))
    assert " \u2014 4 nodes \u2014 world 4 \u2192 3 \u2192 4 nodes \u2014 " in title_of(
        load(folder)
    )
    (folder / "status.json").write_text(json.dumps({"world": world[:1]}))
    assert "world" not in title_of(load(folder))  # the same world throughout


def test_the_goodput_panel_draws_the_goodput_status_json_keeps(tmp_path) -> None:
    records = make_records(nodes=2, per_node=1, steps=100, restart_at=60, lost_node=1)
    folder = write_run(tmp_path, "r1", records, torn=False)
    status = {"state": "succeeded", "started_at": now_iso(T0 - 1.0), "nnodes": 2}
    (folder / "status.json").write_text(json.dumps(status))
    assert not load(folder).ended  # running: the goodput so far, to the last record
    end = records[-1]["time"] + 2.0
    kept = close(folder, end)  # as the run's last line does
    assert kept is not None and kept["steps"] and kept["faults"]["count"] == 1
    run = load(folder)
    assert run.ended and run.goodput is not None
    drawn = run.goodput.to_dict()
    assert drawn["wall_s"] == pytest.approx(kept["wall_s"], abs=0.01)
    for phase, seconds in kept["phases"].items():
        assert drawn["phases"][phase] == pytest.approx(seconds, abs=0.01), phase
    assert run.goodput.timeline[0][0] == pytest.approx(T0 - 1.0, abs=0.01)
    assert run.goodput.timeline[-1][1] == pytest.approx(end, abs=0.01)
    assert_png(draw(run, folder / "plot.png"))
