"""Seeing a running job, on the namespace cluster: `orchestrator top` in a real terminal (tmux)
on a 16-rank trainer run shows every rank and a step that advances; nobody is named a
straggler while nothing is slowed; one rank slowed from outside (its CPU capped to a few per
cent of a core by a cgroup) is named within 30 s, on screen and in status.json. After the
run, metrics.jsonl holds every rank's metrics and every node's samples, `top --once` prints
every rank, and `plot` draws the loss the file holds.

Why a cgroup: with 16 ranks on 2 cores each rank's own work is a few per cent of its step,
so a SIGSTOP nearly always lands while the rank waits in the all-reduce (where everyone
waits with it), and nice or taskset are undone by the scheduler's per-session groups. A CPU
quota slows exactly the computing, as a slow or shared CPU would."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.console.plot import load
from orchestrator.options.supervision import STRAGGLER_WINDOW_S
from tests.cli_helpers import (
    ORCHESTRATOR,
    assert_nothing_left,
    run_cli,
    status_of,
    wait_until,
)
from tests.lab.bad_days import cpu_capped, cpu_cgroup_root
from tests.lab.packages import ensure_prerequisites

pytestmark = pytest.mark.cluster

NODES, SLOTS = 4, 4
WORLD = NODES * SLOTS
TRAIN = [
    "-m", "orchestrator.trainer", "--synthetic-samples", "100000", "--batch-size", "16",
    "--no-eval", "--log-every", "500", "--epochs", "1000",
]  # fmt: skip
SLOWED = 6  # a rank of node 1, not node 0's rank 0
CAP = 0.03  # of one core, for every thread of the slowed rank together
ROW = re.compile(r"^\s*(\d+)\s+(\S+)\s+(\S+)\s+(\d+|-)\s", re.M)


class Terminal:
    """A tmux session of its own, 220 x 60, running one command."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.name = f"orchestrator-top-{time.monotonic_ns()}"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k in EXPORTED)
        line = f"env {exports} {shlex.join(command)}; sleep 600"
        size = ["-x", "220", "-y", "60"]
        # Sized before the command starts: a detached session may begin at 80 x 24.
        for tmux in (
            ["new-session", "-d", "-s", self.name, *size, "sleep 600"],
            ["resize-window", "-t", self.name, *size],
            ["respawn-pane", "-k", "-t", self.name, line],
        ):
            subprocess.run(["tmux", *tmux], check=True)

    def screen(self) -> str:
        return subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


EXPORTED = ("PATH", "HOME", "PYTHONPATH", "VIRTUAL_ENV", "TERM", "LANG")


def steps_on(screen: str) -> dict[int, int]:
    """rank -> the step its row shows (rows without a step yet are left out)."""
    return {int(m[1]): int(m[4]) for m in ROW.finditer(screen) if m[4] != "-"}


def test_top_shows_every_rank_live_and_names_the_rank_slowed_from_outside(
    make_cluster, tmp_path: Path
) -> None:
    ensure_prerequisites(("tmux",))
    if cpu_cgroup_root() is None:
        pytest.skip("no writable cgroup cpu controller here to slow a rank with")
    runs, run_id = tmp_path / "runs", "watched"
    with make_cluster(NODES) as cluster:
        hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=SLOTS)
        env = cluster.environ()
        started = run_cli(
            ["launch", str(hostfile), "--run-dir", str(runs), "--run-id", run_id,
             "--detach", "--env=OMP_NUM_THREADS=1", "--", *TRAIN],
            cwd=tmp_path, env=env, timeout=300,
        )  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
        top = [*ORCHESTRATOR, "top", run_id, "--run-dir", str(runs)]
        terminal = Terminal(top, {**env, "TERM": "xterm-256color"})
        try:
            # Every rank on screen, each with a step.
            try:
                wait_until(lambda: len(steps_on(terminal.screen())) == WORLD, 240, "every step")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; the screen:\n{terminal.screen()}") from None
            first = steps_on(terminal.screen())
            # Unslowed: the steps advance and nobody is named over a whole window and more.
            time.sleep(STRAGGLER_WINDOW_S + 5)
            screen = terminal.screen()
            later = steps_on(screen)
            assert all(later[r] > first[r] for r in range(WORLD)), (first, later)
            assert "straggler" not in screen, screen
            assert status_of(runs, run_id)["stragglers"] == [], screen
            # Slowed from outside: the rank's CPU capped; it computes slowly, waits as fast.
            pids = cluster.pids_with_env("RANK", str(SLOWED))
            assert pids, "no process of the rank to slow"
            with cpu_capped(pids, CAP):
                began = time.monotonic()

                def named() -> list[dict]:
                    return status_of(runs, run_id)["stragglers"]

                wait_until(named, 60, f"rank {SLOWED} named a straggler")
                took = time.monotonic() - began
                (straggler,) = named()
                assert (straggler["rank"], straggler["why"]) == (SLOWED, "work"), straggler
                assert took <= 30, f"named after {took:.0f} s"
                wait_until(lambda: "straggler" in terminal.screen(), 10, "the straggler shown")
                screen = terminal.screen()
            flagged = [line for line in screen.splitlines() if "straggler:" in line]
            assert flagged and ROW.match(flagged[0])[1] == str(SLOWED), screen
            print(f"rank {SLOWED} named after {took:.1f} s: {straggler}", file=sys.stderr)
        finally:
            terminal.close()
            run_cli(["stop", run_id, "--run-dir", str(runs), "--wait", "120"], env=env, timeout=180)
        assert_nothing_left(run_id)
        hosts = {node.name for node in cluster.nodes}
    records = [json.loads(line) for line in (runs / run_id / "metrics.jsonl").open()]
    ranked = {r["rank"] for r in records if "metrics" in r and "work_s" in r["metrics"]}
    assert ranked == set(range(WORLD))
    sampled = {r["host"] for r in records if "sample" in r}
    assert sampled == hosts
    assert [r["rank"] for r in records if r.get("event") == "straggler"] == [SLOWED]
    probed = {r["host"]: r["time"] for r in records if r.get("event") == "probe"}
    starts = {r["host"]: r["time"] for r in records if r.get("event") == "start"}
    assert probed.keys() == starts.keys() == hosts
    assert all(probed[host] < starts[host] for host in hosts), (probed, starts)
    once = run_cli(["top", run_id, "--run-dir", str(runs), "--once"], timeout=60)
    assert once.returncode == 0, once.stderr
    assert sorted(int(m[1]) for m in ROW.finditer(once.stdout)) == list(range(WORLD))
    png = tmp_path / "run.png"
    drawn = run_cli(["plot", run_id, "--run-dir", str(runs), "-o", str(png)], timeout=120)
    assert drawn.returncode == 0, drawn.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plotted = load(runs / run_id)
    for rank in (0, SLOWED):
        written = [
            (r["metrics"]["step"], r["metrics"]["loss"])
            for r in records
            # the steps' records; rank 0 also marks its start and its checkpoints (goodput)
            if r.get("rank") == rank and "step" in r.get("metrics", {})
        ]
        assert plotted.ranks[rank].loss == sorted(dict(written).items())
