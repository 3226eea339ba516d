"""`top` through the real command line, and a bad --stragglers rule refused by it: each test
runs `python -m orchestrator` as a process of its own beside the pure part it checks (the
metrics' pure parts are tests/unit/supervise/test_metrics.py)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from orchestrator.console.rank_table import RunView, duration, stuck_ranks
from orchestrator.options.supervision import Supervision
from orchestrator.record.runs import RunRecord
from orchestrator.supervise.stack_groups import fold, render_groups
from tests.cli_helpers import run_cli
from tests.unit.supervise.test_metrics import write_record


def test_the_rule_is_the_users_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    from tests.factories import supervisor

    supervision = Supervision(grace=1, heartbeat_timeout=0, stragglers=(3.0, 60), hang_timeout=0)
    sup = supervisor(None, ("n0",), label="{host} r{rank}", supervision=supervision)
    assert (sup.metrics.stragglers.ratio, sup.metrics.stragglers.window_s) == (3.0, 60)
    for bad in ("1,20", "2", "x,20", "1.5,0"):
        refused = run_cli(["launch", "hostfiles/local.txt", "--stragglers", bad, "--dry-run"])
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"--stragglers '{bad}': give RATIO,SECONDS" in refused.stderr, refused.stderr
        assert "RATIO,SECONDS" in refused.stderr and "Traceback" not in refused.stderr


def test_top_once_prints_every_rank_of_a_record(tmp_path: Path) -> None:
    write_record(tmp_path, 16, 4, slow=5)
    result = run_cli(["top", "r1", "--run-dir", str(tmp_path)], timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("run r1: running, 16 rank(s) on 4 node(s)")
    assert "1 straggler(s)" in lines[0]
    body = [line.split() for line in lines[2:] if line.strip()]
    assert sorted(int(words[0]) for words in body) == list(range(16))
    assert body[0][0] == "5" and "straggler:" in lines[2]
    missing = run_cli(["top", "nope", "--run-dir", str(tmp_path)], timeout=60)
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr
    assert "Traceback" not in missing.stderr


def silent_record(tmp_path: Path, silent: dict[int, float], hang: dict | None = None) -> RunRecord:
    """A run of four ranks on two nodes: each rank's log last written `silent[rank]` s ago
    (its metrics earlier still); rank 2 has ended. `hang`: status.json's, where it hung."""
    record = RunRecord.create(tmp_path, "r1")
    ranks = [
        {"rank": r, "node_rank": r // 2, "host": "ab"[r // 2], "state": "running"} for r in range(4)
    ]
    ranks[2]["state"] = "succeeded"
    record.write_status({"state": "running", "ranks": ranks, **({"hang": hang} if hang else {})})
    now = time.time()
    with open(record.metrics_path, "w") as out:
        for r in range(4):
            metrics = {"step": 7, "loss": 0.5}
            out.write(json.dumps({"time": now - 600, "rank": r, "metrics": metrics}) + "\n")
    record.logs_dir.mkdir(parents=True, exist_ok=True)
    for rank, seconds in silent.items():
        log = record.logs_dir / f"rank-{rank}.log"
        log.write_text("a line\n")
        os.utime(log, (now - seconds, now - seconds))
    return record


def test_every_running_ranks_silence_is_a_column_and_the_header_says_all_are_quiet(
    tmp_path: Path,
) -> None:
    assert [duration(s) for s in (4.7, 59, 60, 130, 300, 3900, 7200)] == [
        "4s", "59s", "1m", "2m10s", "5m", "1h05m", "2h"
    ]  # fmt: skip
    view = RunView(silent_record(tmp_path, {0: 130, 1: 45, 2: 5, 3: 50}))
    view.refresh()
    now = time.time()
    rows = {row.rank: row for row in view.rows(now)}
    assert [duration(rows[r].silent_s) for r in (0, 1, 3)] == ["2m10s", "45s", "50s"]
    assert rows[2].silent_s is None  # ended: no silence to show
    assert rows[0].flag == "" and view.header(now).endswith(", quiet 45s")
    result = run_cli(["top", "r1", "--run-dir", str(tmp_path)], timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.search(r"step 7, loss 0\.5000, quiet 4[5-9]s$", lines[0]), lines[0]
    assert re.search(r"WORK MS +SILENT +CPU %", lines[1]), lines[1]
    body = {int(line.split()[0]): line for line in lines[2:] if line.strip()}
    assert re.search(r" 2m1\ds ", body[0]) and re.search(r" 4[5-9]s ", body[1])
    assert not re.search(r"\b\d+(s|m\d\ds|m)\b", body[2])  # blank for the ended rank


def hang_status(stuck: list[int] | None = None) -> dict:
    """status.json's `hang` as Hang.status writes it, the groups from real stacks: rank 3
    waits in its own function, ranks 0 and 1 in train.py's step."""

    def stack(rank: int, function: str, line: int) -> dict:
        frames = [{"function": function, "file": "/job/train.py", "line": line}]
        threads = [{"name": "MainThread", "id": 1, "frames": frames}]
        return {"rank": rank, "threads": threads, "error": None}

    records = [stack(0, "step", 30), stack(1, "step", 30), stack(3, "wait_for_data", 12)]
    groups = render_groups(fold(records, {0: "a", 1: "a", 3: "b"}))
    hang = {"found_at": "2026-01-01T00:00:00", "quiet_s": 64.2, "groups": groups}
    return {**hang, "stacks": "runs/r1/stacks/x", **({"stuck_ranks": stuck} if stuck else {})}


def test_a_hung_run_says_so_over_the_table_and_its_stuck_ranks_come_first(
    tmp_path: Path,
) -> None:
    hang = hang_status([3])
    assert hang["groups"][0] == "[b r3] 1 rank: main thread in wait_for_data (train.py:12)"
    assert stuck_ranks(hang) == {3}
    assert stuck_ranks(hang_status()) == stuck_ranks(None) == set()  # one group: none odd
    view = RunView(silent_record(tmp_path, {0: 1, 1: 1, 3: 1}, hang))
    view.refresh()
    now = time.time()
    assert view.header(now).splitlines()[1:] == [
        "hung: no rank moved for 64 s; first group: "
        "[b r3] 1 rank: main thread in wait_for_data (train.py:12)",
        "stacks of every rank: runs/r1/stacks/x",
    ]
    view.status["ranks"][0]["state"] = "failed"  # stuck comes before even a failure
    rows = view.rows(now)
    assert [(r.rank, r.flag) for r in rows[:2]] == [(3, "stuck"), (0, "failed")]
    result = run_cli(["top", "r1", "--run-dir", str(tmp_path)], timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == view.header(now).splitlines()[1]
    assert lines[2] == "stacks of every rank: runs/r1/stacks/x"
    assert lines[4].split()[0] == "3" and lines[4].rstrip().endswith("  stuck")


def test_top_help_says_what_its_figures_cover_and_what_silent_means() -> None:
    result = run_cli(["top", "--help"], timeout=60)
    text = " ".join(result.stdout.split())
    assert "cover the rank's latest window, not the whole run" in text
    assert "SILENT is how long a running rank has said nothing" in text
    assert "`stuck`" in text
