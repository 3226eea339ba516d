"""The metrics channel's pure parts: stragglers named from work and silence, metrics.jsonl as
the controller writes it, node samples (of real processes: tests/local/test_node_samples.py),
and what `top` makes of a record (the command itself:
tests/local/test_metrics_local.py)."""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

from orchestrator.agent.protocol import WITH_PAYLOAD, frame
from orchestrator.agent.sampling import differs, parse_apps, parse_gpus
from orchestrator.backends.sessions import FrameParser
from orchestrator.console.rank_table import RunView
from orchestrator.record.runs import RunRecord
from orchestrator.supervise.metrics import RunMetrics
from orchestrator.supervise.state import NodeState
from orchestrator.supervise.stragglers import Stragglers, median_without

HOSTS = {rank: f"n{rank // 2}" for rank in range(8)}


def feed_work(s: Stragglers, works: dict[int, float], start: float, seconds: int) -> float:
    """One metrics record per rank and second, each with its `work_s` over 10 steps."""
    for t in range(seconds):
        for rank, work in works.items():
            s.observe(rank, {"work_s": work, "steps": 10}, start + t)
    return start + seconds - 1


def test_a_rank_whose_work_stays_above_the_median_is_named_once() -> None:
    s = Stragglers(HOSTS, ratio=1.5, window_s=20)
    works = {rank: 0.010 for rank in range(8)} | {5: 0.021}
    now = feed_work(s, works, 1000.0, 8)
    assert s.check(now, set(range(8))) == []  # the window is not yet half full
    now = feed_work(s, works, now + 1, 10)
    (named,) = s.check(now, set(range(8)))
    assert (named.rank, named.host, named.why) == (5, "n2", "work")
    assert abs(named.ratio - 2.1) < 0.01
    assert named.line().startswith("straggler: rank 5 on n2, its step work 2.1x the median")
    assert s.check(now + 1, set(range(8))) == []  # named once
    assert [entry["rank"] for entry in s.status()] == [5]


def test_equal_ranks_and_a_slow_rank_that_is_not_running_name_nobody() -> None:
    s = Stragglers(HOSTS)
    now = feed_work(s, {rank: 0.010 + 0.001 * (rank % 3) for rank in range(8)}, 0.0, 30)
    assert s.check(now, set(range(8))) == []
    s = Stragglers(HOSTS)
    now = feed_work(s, {rank: 0.010 for rank in range(8)} | {3: 0.05}, 0.0, 30)
    assert s.check(now, set(range(8)) - {3}) == []


def test_a_rank_that_fell_silent_while_the_others_speak_is_named() -> None:
    s = Stragglers(HOSTS, silent_min_s=30)
    for t in range(60):
        for rank in range(8):
            if rank != 6 or t < 10:
                s.heard_from(rank, float(t))
    assert s.check(35.0, set(range(8))) == []  # silent 25 s: under the minimum
    (named,) = s.check(59.0, set(range(8)))
    assert (named.rank, named.why) == (6, "silent")
    assert "silent for 50 s" in named.line()


def test_silence_names_nobody_when_only_rank_0_prints_or_everyone_waits() -> None:
    s = Stragglers({0: "a", 1: "b"}, silent_min_s=30)
    s.heard_from(1, 0.0)  # its start line, once
    for t in range(100):
        s.heard_from(0, float(t))
    assert s.check(99.0, {0, 1}) == []
    s = Stragglers(HOSTS, silent_min_s=30)
    for t in range(10):
        for rank in range(8):
            s.heard_from(rank, float(t))
    assert s.check(200.0, set(range(8))) == []  # all silent alike: a hang, not a straggler


def test_the_other_ranks_median_is_the_median_of_the_list_without_the_rank() -> None:
    # check() sorts once per pass instead of building every rank's "others" (quadratic in
    # the ranks, every second); ties, odd and even counts, and one rank alone.
    picks = random.Random(7)
    for _ in range(2000):
        values = [
            picks.choice([1.0, 2.0, 2.0, picks.uniform(0, 9)]) for _ in range(picks.randint(1, 9))
        ]
        ordered = sorted(values)
        for i, value in enumerate(values):
            others = values[:i] + values[i + 1 :]
            assert median_without(ordered, value) == (statistics.median(others) if others else None)


def test_metrics_jsonl_stamps_each_record_and_skips_what_is_not_json(tmp_path: Path) -> None:
    notes: list[str] = []
    path = tmp_path / "metrics.jsonl"
    metrics = RunMetrics(path, HOSTS, notes.append)
    node = NodeState(index=1, host="n1", ranks=(2, 3))
    metrics.rank_lines(node, 2, b'{"step": 1, "loss": 2.5}\nnot json\n[1, 2]\n{"step": 2}\n', 10.0)
    metrics.rank_lines(node, 2, b"again not json\n", 11.0)
    metrics.node_sample(node, b'{"cpu_percent": 150.0, "ranks": {}}', 12.0)
    metrics.event("start", node)
    metrics.event("stop", detail="Ctrl-C")
    metrics.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[0] == {
        "time": 10.0,
        "host": "n1",
        "node_rank": 1,
        "rank": 2,
        "metrics": {"step": 1, "loss": 2.5},
    }
    assert records[1]["metrics"] == {"step": 2}
    assert records[2]["sample"] == {"cpu_percent": 150.0, "ranks": {}}
    assert (records[3]["event"], records[3]["host"]) == ("start", "n1")
    assert (records[4]["event"], records[4]["host"], records[4]["detail"]) == (
        "stop",
        None,
        "Ctrl-C",
    )
    assert len(notes) == 1 and "rank 2 wrote a line that is not a JSON object" in notes[0]


def test_metric_and_sample_frames_carry_their_payload_through_the_parser() -> None:
    assert {"Q", "P"} <= WITH_PAYLOAD
    data = frame("Q", 3, payload=b'{"step": 1}\n') + frame("P", payload=b"{}") + frame("H", 1)
    assert FrameParser().feed(data) == [
        ("Q", ("3",), b'{"step": 1}\n'),
        ("P", (), b"{}"),
        ("H", ("1",), b""),
    ]


def test_a_sample_is_shipped_when_it_says_something_new() -> None:
    gpu = {"index": 0, "util_percent": 90, "mem_used_bytes": 1000, "temp_c": 60}
    rank = {"cpu_percent": 98.0, "rss_bytes": 1000, "gpu": 0}
    last = {"cpu_percent": 100.0, "rss_bytes": 1000, "ranks": {"0": rank}, "gpus": [gpu]}

    def changed(**edits) -> dict:
        sample = json.loads(json.dumps(last))
        for where, value in edits.items():
            *path, key = where.split("__")
            entry = sample
            for part in path:
                entry = entry[int(part)] if isinstance(entry, list) else entry[part]
            entry[key] = value
        return sample

    assert differs(None, last)
    assert not differs(last, changed(cpu_percent=103.0, rss_bytes=1040))  # within the steps
    assert not differs(last, changed(gpus__0__temp_c=62, ranks__0__cpu_percent=94.0))
    assert differs(last, changed(cpu_percent=106.0))
    assert differs(last, changed(ranks__0__rss_bytes=1100))
    assert differs(last, changed(gpus__0__util_percent=80))
    assert differs(last, changed(ranks__0__gpu=1))
    assert differs(last, {**last, "ranks": {}})  # a rank gone
    assert differs({**last, "ranks": {"0": {**rank, "cpu_percent": None}}}, last)


def test_nvidia_smi_csv_becomes_gpu_entries_and_per_process_memory() -> None:
    gpus = parse_gpus(
        "0, GPU-aaa, 97, 30512, 81559, 61\n1, GPU-bbb, [N/A], 0, 81559, 35\nNo devices\n"
    )
    assert gpus[0] == {
        "index": 0,
        "uuid": "GPU-aaa",
        "util_percent": 97,
        "mem_used_bytes": 30512 << 20,
        "mem_total_bytes": 81559 << 20,
        "temp_c": 61,
    }
    assert "util_percent" not in gpus[1] and gpus[1]["temp_c"] == 35
    assert parse_apps("4242, GPU-aaa, 30000\n[N/A]\n") == {4242: ("GPU-aaa", 30000 << 20)}


def write_record(tmp_path: Path, ranks: int, per_node: int, slow: int | None = None) -> RunRecord:
    record = RunRecord.create(tmp_path, "r1")
    status = {
        "state": "running",
        "ranks": [
            {
                "rank": r,
                "node_rank": r // per_node,
                "host": f"ceon{r // per_node}",
                "state": "running",
            }
            for r in range(ranks)
        ],
        "stragglers": [{"rank": slow, "why": "work", "ratio": 2.1}] if slow is not None else [],
    }
    record.write_status(status)
    now = time.time()
    with open(record.metrics_path, "w") as out:
        for r in range(ranks):
            work = 0.02 if r == slow else 0.01
            metrics = {"step": 100, "loss": 0.5, "samples_per_s": 800.0, "work_s": work}
            out.write(
                json.dumps({"time": now, "rank": r, "node_rank": r // per_node, "metrics": metrics})
                + "\n"
            )
        for n in range(ranks // per_node):
            sample = {
                "ranks": {str(r): {"cpu_percent": 99.0, "rss_bytes": 1 << 28} for r in range(ranks)}
            }
            out.write(json.dumps({"time": now, "node_rank": n, "sample": sample}) + "\n")
        out.write('{"time": 1, "rank": 0, "metr')  # a record still being written
    return record


def test_top_rows_put_the_straggler_first_and_fold_the_rest_to_fit(tmp_path: Path) -> None:
    view = RunView(write_record(tmp_path, 256, 8, slow=37))
    view.refresh()
    rows = view.rows(time.time())
    assert len(rows) == 256 and rows[0].rank == 37 and rows[0].flag.startswith("straggler")
    assert rows[1].rank == 0 and (rows[1].step, rows[1].cpu_percent) == (100, 99.0)
    folded = view.rows(time.time(), room=40)
    assert len(folded) <= 40 and folded[0].rank == 37
    assert sum(row.count for row in folded) == 256
    assert folded[1].ranks == "0-7" and folded[1].host == "ceon0"  # a node: 8 ranks, one row
    assert folded[1].samples_per_s == 8 * 800.0
    tight = view.rows(time.time(), room=10)
    assert len(tight) <= 10 and sum(row.count for row in tight) == 256
    assert tight[1].host.startswith("ceon[")  # nodes alike, folded together
