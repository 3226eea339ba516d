"""A hung job on the namespace cluster, 4 nodes x 2 ranks: one rank waits forever in a
function of its own before an all_reduce that the 7 others wait in.

`orchestrator stacks` names that rank first (its host, function and file:line) and the 7
others as one group in the all_reduce, within 10 s, by py-spy and by the ranks' own signal
hook alike, and keeps every stack in the run record. With --hang-timeout the run itself
finds the hang: the console names the rank, the run ends `hung` with exit 1, its summary
names the rank, and nothing is left running.

Output is not progress: on the session's 3 nodes, ranks whose logging threads print every
2 s while rank 1's main thread is deadlocked on a lock (the others in an all_reduce) are
found hung within --hang-timeout + 30 s, rank 1's frame first; the same job whose main
threads work runs to its end, said working once.

Where a user looks: rank 1 of the session's 3 nodes waits on its DataLoader, whose worker
blocks reading a pipe nobody writes in the user's Dataset; `stacks` and the hung verdict
name the main thread's line in the training loop and, under it, the worker's frame in the
Dataset."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from orchestrator.supervise.hangs import LULL_S, SAMPLE_GAP_S
from tests.cli_helpers import assert_nothing_left, run_cli, start_cli, status_of, wait_until

pytestmark = pytest.mark.cluster

NODES, SLOTS, STUCK = 4, 2, 5
# --hang-timeout of the runs that check by themselves. A check is what is waited for: due a
# timeout after the last progress, put off by the ranks' lines up to LULL_S (5 s), and
# judged SAMPLE_GAP_S (5 s) later, so a hang is found about 15 s after it begins. A check
# that falls while the ranks still start sees them move (or not all of them there) and is
# no verdict; the next comes a timeout later: the timeout need not outlast the start (the
# local tier's hang tests run under 5 s too).
HANG_TIMEOUT = 5
# The data loader's run: `stacks` must see rank 1's worker in its read (it forks after
# "ready" and may take seconds to get there) before the run ends hung, 20 s after "ready".
LOADER_HANG_TIMEOUT = 10
JOB = Path(__file__).resolve().parents[1] / "data" / "hang_job.py"
STUCK_LINE = JOB.read_text().splitlines().index("        time.sleep(0.5)") + 1
LAUNCH = ["--env", f"STUCK_RANK={STUCK}", "--", str(JOB)]


def ready(runs: Path, run_id: str) -> bool:
    log = runs / run_id / "logs" / "combined.log"
    return log.exists() and log.read_text(errors="replace").count("ready") >= NODES * SLOTS


def check_groups(lines: list[str], host: str) -> None:
    """The odd rank first, named with its host, function and line; then the 7 others."""
    first, second = lines[0], lines[1]
    assert first.startswith(f"[{host} r{STUCK}] 1 rank: main thread in "), lines
    assert f"wait_for_a_batch_that_never_comes (hang_job.py:{STUCK_LINE})" in first, lines
    assert second.startswith("[") and "7 ranks:" in second and "all_reduce" in second, lines


def test_stacks_name_the_stuck_rank_and_a_hang_ends_the_run(make_cluster, tmp_path: Path):
    runs = tmp_path / "runs"
    with make_cluster(NODES) as cluster:
        hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=SLOTS)
        env = cluster.environ()
        host = cluster.nodes[STUCK // SLOTS].name

        # On demand, on a detached run that does not check for hangs by itself.
        started = run_cli(
            ["launch", str(hostfile), "--run-dir", str(runs), "--run-id", "asked",
             "--detach", "--hang-timeout", "0", *LAUNCH],
            cwd=tmp_path, env=env, timeout=300,
        )  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
        try:
            wait_until(lambda: ready(runs, "asked"), 240, "every rank ready")
            time.sleep(2)  # the 7 reach the all_reduce
            for method in ("auto", "signal"):
                began = time.monotonic()
                shown = run_cli(
                    ["stacks", "asked", "--run-dir", str(runs), "--method", method],
                    env=env, timeout=60,
                )  # fmt: skip
                took = time.monotonic() - began
                assert shown.returncode == 0, shown.stdout + shown.stderr
                lines = shown.stdout.splitlines()
                print(f"stacks --method {method} in {took:.1f} s:\n{shown.stdout}")
                check_groups(lines, host)
                assert took <= 10, f"stacks took {took:.1f} s"
                way = "py-spy" if method == "auto" else "signal"
                assert "stacks of 8 rank(s) taken in" in lines[-1] and f"by {way}" in lines[-1]
                folder = Path(lines[-1].rsplit(" in ", 1)[1])
                assert sorted(p.name for p in folder.glob("rank-*.txt")) == [
                    f"rank-{r}.txt" for r in range(8)
                ]
                kept = json.loads((folder / "stacks.json").read_text())
                assert len(kept["ranks"]) == 8 and kept["groups"][0] == lines[0]
                assert (
                    "wait_for_a_batch_that_never_comes"
                    in (folder / f"rank-{STUCK}.txt").read_text()
                )
        finally:
            run_cli(["stop", "asked", "--run-dir", str(runs), "--wait", "60"], env=env)
        assert_nothing_left("asked")

        # Found by the run itself: --hang-timeout HANG_TIMEOUT (a check while the 8 ranks
        # still start sees their main threads move, and the next comes a timeout later).
        began = time.monotonic()
        hung = run_cli(
            ["launch", str(hostfile), "--run-dir", str(runs), "--run-id", "found",
             "--hang-timeout", str(HANG_TIMEOUT), *LAUNCH],
            cwd=tmp_path, env=env, timeout=600,
        )  # fmt: skip
        took = time.monotonic() - began
        print(hung.stdout)
        assert hung.returncode == 1, hung.stdout + hung.stderr
        console = hung.stdout.splitlines()
        at = next(i for i, line in enumerate(console) if "] hung: no new step" in line)
        check_groups([line.removeprefix("[orchestrator] ") for line in console[at + 1 :]], host)
        status = status_of(runs, "found")
        assert status["state"] == "hung" and status["exit_code"] == 1, status
        assert f"[{host} r{STUCK}] 1 rank" in status["summary"].splitlines()[0], status["summary"]
        assert status["hang"]["stacks"], status["hang"]
        assert status["hang"]["stuck_ranks"] == [STUCK], status["hang"]
        # torch's flight recorder, dumped on every node and read by torch's analyser
        assert (
            f"flight recorder: rank {STUCK} ({host}) never joined collective #1 "
            "(gloo:all_reduce, group 0:default_pg) that the other ranks entered ("
        ) in status["summary"], status["summary"]
        flight = sorted(p.name for p in (runs / "found" / "flight").iterdir())
        assert flight == ["analysis.txt", *(f"rank_{r}" for r in range(8))], flight
        assert "run found hung (exit code 1)" in hung.stdout
        assert_nothing_left("found")
        print(f"the hung run ended after {took:.0f} s")


PRINTING = Path(__file__).resolve().parents[1] / "data" / "printing_deadlock_job.py"
SECOND_ACQUIRE = 1 + PRINTING.read_text().splitlines().index(
    "    lock.acquire()  # not reentrant: never returns"
)
PRINTING_TIMEOUT = HANG_TIMEOUT
# The working job's main threads work this long after "ready": a whole check (the timeout,
# the lull the printing threads never give, the gap to the second sample) counted from the
# last progress, which came before the work or in it: a check is judged while they work,
# where a false hang verdict would fire (15 s; it was 30 s with a timeout of 20).
WORK_S = PRINTING_TIMEOUT + LULL_S + SAMPLE_GAP_S


def launch_printing(cluster, tmp_path: Path, run_id: str, env: str):
    """The printing job with `env` on the session's nodes, one rank a node, under
    --hang-timeout PRINTING_TIMEOUT: (the finished launch, its combined log, the wall time
    it ended)."""
    runs = tmp_path / "runs"
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=1)
    done = run_cli(
        ["launch", str(hostfile), "--run-dir", str(runs), "--run-id", run_id,
         "--hang-timeout", str(PRINTING_TIMEOUT), "--env", env, "--", str(PRINTING)],
        cwd=tmp_path, env=cluster.environ(), timeout=300,
    )  # fmt: skip
    ended = time.time()
    print(done.stdout)
    return done, (runs / run_id / "logs" / "combined.log").read_text(errors="replace"), ended


def test_ranks_that_print_but_make_no_progress_are_found_hung(cluster, tmp_path: Path) -> None:
    """Rank 1's main thread deadlocks on a lock, the others wait in an all_reduce, and every
    rank's logging thread goes on printing: the run ends `hung` (exit 1) within the timeout
    and 30 s of the deadlock, naming rank 1's frame, the second acquire, first."""
    done, log, ended = launch_printing(cluster, tmp_path, "prints", "DEADLOCK_RANK=1")
    assert done.returncode == 1, done.stdout + done.stderr
    readies = [float(t) for t in re.findall(r"\bready (\d+\.\d+)", log)]
    assert len(readies) == len(cluster.nodes), log
    took = ended - max(readies)  # the deadlock came right after the last rank was ready
    assert took <= PRINTING_TIMEOUT + 30, f"ended {took:.0f} s after the deadlock"
    assert log.count("memory") >= 3 * len(cluster.nodes), "the logging threads printed"
    console = [line.removeprefix("[orchestrator] ") for line in done.stdout.splitlines()]
    at = next(i for i, line in enumerate(console) if line.startswith("hung: no new step"))
    assert console[at + 1].startswith(
        f"[{cluster.nodes[1].name} r1] 1 rank: main thread in take_the_lock_twice "
        f"(printing_deadlock_job.py:{SECOND_ACQUIRE})"
    ), console[at:]
    # After the deadlock no main thread moves, so a "working" verdict is false unless its
    # first sample came while the ranks still started (under a loaded machine's slow start,
    # the timeout can pass before the last "ready"): then their threads did move.
    if "working" in done.stdout:
        taken = sorted(
            json.loads(path.read_text())["taken_at"]
            for path in (tmp_path / "runs" / "prints" / "stacks").glob("*/stacks.json")
        )
        assert taken[0] < max(readies) + 1, (taken, max(readies), done.stdout)
    status = status_of(tmp_path / "runs", "prints")
    assert status["state"] == "hung" and status["hang"]["stuck_ranks"] == [1], status
    assert_nothing_left("prints")
    print(f"ended hung {took:.0f} s after the deadlock")


def test_ranks_that_print_and_work_are_never_stopped(cluster, tmp_path: Path) -> None:
    """Without the deadlock every main thread computes and all_reduces for WORK_S while the
    logging threads print: a check comes all the same (the lines only put it off), sees the
    main threads move, says so once, and the run succeeds."""
    done, log, _ = launch_printing(cluster, tmp_path, "works", f"WORK_S={WORK_S:g}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" s apart: working") == 1, done.stdout
    assert "hung" not in done.stdout and "stopping" not in done.stdout
    assert log.count("worked") == len(cluster.nodes), log
    assert status_of(tmp_path / "runs", "works")["state"] == "succeeded"


LOADER = Path(__file__).resolve().parents[1] / "data" / "stuck_loader_job.py"
LOADER_LINES = LOADER.read_text().splitlines()
READ_LINE = 1 + next(i for i, line in enumerate(LOADER_LINES) if "os.read(self.fd" in line)
LOOP_LINE = 1 + LOADER_LINES.index("    for batch in loader:")


def check_loader_groups(lines: list[str], host: str) -> None:
    """Rank 1 first: its main thread in DataLoader's call from the loop, the innermost
    frame beside; the worker's frame in the Dataset under it."""
    assert lines[0].startswith(f"[{host} r1] 1 rank: main thread in "), lines
    assert "(torch/utils/data/dataloader.py:" in lines[0], lines
    assert f"<- train (stuck_loader_job.py:{LOOP_LINE})" in lines[0], lines
    assert "; innermost " in lines[0], lines
    worker = next(line for line in lines[1:] if line.startswith("    child process"))
    assert worker.startswith("    child process pt_data_worker: main thread in "), lines
    assert f"__getitem__ (stuck_loader_job.py:{READ_LINE})" in worker, lines


def check_loader_stacks(take_stacks, host: str) -> None:
    """`stacks` (``take_stacks()``, the CLI's completed process) as check_loader_groups
    wants it, once rank 1's worker is in its read: it forks after "ready", and a loaded
    machine may take seconds to get it there."""
    deadline = time.monotonic() + 60
    while True:
        shown = take_stacks()
        print(shown.stdout)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        try:
            check_loader_groups(shown.stdout.splitlines(), host)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def check_loader_hung(out: str, host: str) -> None:
    """The launch's console: the hung verdict's groups as check_loader_groups wants them."""
    console = [line.removeprefix("[orchestrator] ") for line in out.splitlines()]
    at = next(i for i, line in enumerate(console) if line.startswith("hung: no new step"))
    check_loader_groups(console[at + 1 :], host)


def test_a_rank_stuck_on_its_data_loader_is_named_in_the_dataset(cluster, tmp_path: Path):
    runs = tmp_path / "runs"
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=1)
    env, host = cluster.environ(), cluster.nodes[1].name
    launch = start_cli(
        ["launch", str(hostfile), "--run-dir", str(runs), "--run-id", "loader",
         "--hang-timeout", str(LOADER_HANG_TIMEOUT), "--env", "STUCK_RANK=1",
         "--", str(LOADER)],
        cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        log = runs / "loader" / "logs" / "combined.log"
        wait_until(lambda: log.exists() and log.read_text().count("ready") >= 3, 240, "ready")
        stacks = ["stacks", "loader", "--run-dir", str(runs)]
        check_loader_stacks(lambda: run_cli(stacks, env=env, timeout=60), host)
        out, _ = launch.communicate(timeout=300)
    finally:
        if launch.poll() is None:
            launch.kill()
    print(out)
    assert launch.returncode == 1, out
    check_loader_hung(out, host)
    status = status_of(runs, "loader")
    assert status["state"] == "hung" and status["hang"]["stuck_ranks"] == [1], status
    assert f"__getitem__ (stuck_loader_job.py:{READ_LINE})" in status["summary"]
    assert_nothing_left("loader")
