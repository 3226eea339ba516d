"""End to end on this machine, through the real CLI and real torchrun: torchrun's own report
of a failure it did not cause stays in the run record (combined.log, the node log) and off
what is read as a console (the attached console, the run's summary, `orchestrator logs`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.cli_helpers import REPO, assert_nothing_left, run_cli, wait_for_line

LOCAL = str(REPO / "hostfiles" / "local.txt")

# Every rank fails, every time: with --max-restarts 1 torchrun restarts them once, then
# gives up and reports it (ChildFailedError, `bash FAILED`), before the orchestrator stops
# anything; so the report is in the record whatever the timing.
FAILING = textwrap.dedent("""
    import os
    rank = int(os.environ["RANK"])
    print(f"rank {rank} working", flush=True)
    raise ValueError(f"rank {rank} gives up")
""")

REPORT = (
    "ChildFailedError",
    "bash FAILED",
    "Root Cause (first observed failure):",
    "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
    "failed (exitcode: 1)",
)


def test_torchruns_failure_report_stays_in_the_record_off_the_console(tmp_path: Path) -> None:
    (tmp_path / "failing_script.py").write_text(FAILING)
    runs = ["--run-dir", str(tmp_path / "runs")]
    done = run_cli(
        ["launch", LOCAL, *runs, "--run-id", "reported", "--color", "never",
         "--max-restarts", "1", "--", "failing_script.py"],
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    logs = tmp_path / "runs" / "reported" / "logs"
    combined = (logs / "combined.log").read_text()
    for words in REPORT:
        assert words in combined, (words, combined)
        assert words in (logs / "node-0.log").read_text()
        assert words not in done.stdout, (words, done.stdout)
    # The console and the summary: our own account, the rank's own traceback whole.
    summary = done.stdout[done.stdout.index("[orchestrator] job failed") :]
    assert "job failed: rank" in summary and "ValueError: rank" in summary, summary
    assert "[localhost] " not in summary, summary
    assert "[localhost r0]   File " in done.stdout and "raise ValueError" in done.stdout

    read = run_cli(["logs", "reported", *runs])
    assert read.returncode == 0, read.stderr
    assert "ValueError: rank 0 gives up" in read.stdout
    for words in REPORT:
        assert words not in read.stdout, (words, read.stdout)
    tail = run_cli(["logs", "reported", *runs, "--tail", "40", "--node", "localhost"])
    assert tail.stdout and "ChildFailedError" not in tail.stdout, tail.stdout
    everything = run_cli(["logs", "reported", *runs, "--torchrun-reports", "--no-fold"])
    assert everything.stdout == combined
    assert_nothing_left("reported")


SLEEPER = textwrap.dedent("""
    import os, time
    rank = int(os.environ["RANK"])
    for i in range(600):
        print(f"rank {rank} tick {i}", flush=True)
        time.sleep(0.1)
""")


def test_logs_of_a_stopped_detached_run_leave_torchruns_shutdown_out(tmp_path: Path) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    runs = ["--run-dir", str(tmp_path / "runs")]
    started = run_cli(
        ["launch", LOCAL, *runs, "--run-id", "bg", "--detach", "--", "sleeper.py"], cwd=tmp_path
    )
    assert started.returncode == 0, started.stdout + started.stderr
    wait_for_line(tmp_path / "runs" / "bg" / "logs" / "rank-1.log", "rank 1 tick 3", 60)
    stopped = run_cli(["stop", "bg", *runs])
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    combined = (tmp_path / "runs" / "bg" / "logs" / "combined.log").read_text()
    assert "Received 15 death signal" in combined, combined
    read = run_cli(["logs", "bg", *runs, "--no-fold"])
    assert "rank 1 tick 3" in read.stdout and "[orchestrator] stopped by SIGTERM" in read.stdout
    assert "[localhost] " not in read.stdout, read.stdout  # torchrun said only its shutdown
    assert read.stdout.count("\n") < combined.count("\n")
    assert_nothing_left("bg")
