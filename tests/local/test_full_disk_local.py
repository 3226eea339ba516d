"""End to end on this machine, no fakes: the controller's --run-dir is a small tmpfs that the
ranks' output fills while the job runs. The job goes on, the console says so once, and the
rank files end up exactly what the ranks printed: completed at the end of the run when space
has returned by then, or later by `orchestrator logs RUN --fetch`.

Mounting needs root; elsewhere these tests skip and say why (with CI=true they fail)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_helpers import ORCHESTRATOR, REPO, run_cli, status_of, wait_for_line
from tests.lab.fixtures import under_ci

LOCAL = str(REPO / "hostfiles" / "local.txt")
WARNING = "warning: cannot write the run record: No space left on device"
FIRST, SECOND = 40000, 300  # lines per rank before and after the test gives space

# Numbered lines, FIRST of them at once (more than the tmpfs holds), then, once the test has
# given space (the file named by argv[1] exists), SECOND more.
CHATTY = textwrap.dedent("""
    import os, sys, time
    rank = int(os.environ["RANK"])
    go, first, second = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for i in range(first):
        print(f"rank {rank} line {i:06d} " + "x" * 60, flush=i % 500 == 0)
    sys.stdout.flush()
    deadline = time.time() + 180
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.1)
    for i in range(first, first + second):  # over more than the sink's retry interval
        print(f"rank {rank} line {i:06d} " + "x" * 60, flush=True)
        time.sleep(0.015)
""")


def printed(rank: int) -> str:
    return "".join(f"rank {rank} line {i:06d} {'x' * 60}\n" for i in range(FIRST + SECOND))


def unavailable(why: str) -> None:
    if under_ci():
        pytest.fail(f"CI=true and this test cannot run here: {why}", pytrace=False)
    pytest.skip(why)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        unavailable(f"needs root to mount a {size} tmpfs as --run-dir (euid {os.geteuid()})")
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        unavailable(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def resize(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def env(tmp_path: Path) -> dict[str, str]:
    """The nodes' copies (~/.orchestrator/runs) go into a home of the test's own."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**os.environ, "HOME": str(home)}


def start(tmp_path: Path, run_id: str) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "chatty.py").write_text(CHATTY)
    out = tmp_path / f"{run_id}.out"
    args = ["launch", LOCAL, "--run-dir", str(tmp_path / "runs"), "--run-id", run_id]
    args += ["--color", "never", "--", "chatty.py", str(tmp_path / "go"), str(FIRST), str(SECOND)]
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [*ORCHESTRATOR, *args],
            cwd=tmp_path,
            env=env(tmp_path),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    return proc, out


def finish(proc: subprocess.Popen, out: Path) -> str:
    try:
        code = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    text = out.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert text.count(WARNING) == 1, [line for line in text.splitlines() if "warning" in line]
    return text


def test_a_full_run_dir_does_not_stop_the_job_and_its_rank_files_are_completed(
    tmp_path: Path,
) -> None:
    with tmpfs(tmp_path / "runs", "4m") as runs:
        proc, out = start(tmp_path, "full")
        wait_for_line(out, WARNING, timeout=120)
        # Space returns while the ranks still run, once the controller has taken all of the
        # first part (the console is not on the full disk): every rank file missed bytes
        # then, whichever file met the full disk first.
        for rank in (0, 1):
            wait_for_line(out, f"rank {rank} line {FIRST - 1:06d}", timeout=120)
        resize(runs, "64m")
        (tmp_path / "go").touch()
        text = finish(proc, out)
        assert "completed from the nodes' copies" in text
        logs = runs / "full" / "logs"
        for rank in (0, 1):
            assert (logs / f"rank-{rank}.log").read_text() == printed(rank), rank
            # the combined log lost lines while the disk was full, and goes on after
            last = f"[localhost r{rank}] rank {rank} line {FIRST + SECOND - 1:06d}"
            assert last in (logs / "combined.log").read_text()
        # Lines the combined log missed (whether it did depends on when its buffered writes
        # met the full disk) are said to be missing, in place.
        combined = (logs / "combined.log").read_text()
        whole = sum(line.startswith("[localhost r") for line in combined.splitlines())
        if whole < 2 * (FIRST + SECOND):
            assert "bytes of output are missing here" in combined
        status = status_of(runs, "full")
        assert status["state"] == "succeeded" and status["exit_code"] == 0
        assert "incomplete_logs" not in status and status["node_copies"] == "removed"
        assert not list(logs.glob(".*"))


def test_rank_files_still_incomplete_at_the_end_are_fetched_later(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "runs", "6m") as runs:
        ballast = runs / "ballast"
        ballast.write_bytes(b"\0" * (1 << 20))
        proc, out = start(tmp_path, "short")
        wait_for_line(out, WARNING, timeout=120)
        for rank in (0, 1):  # the ranks wait: what they printed so far has been streamed
            wait_for_line(out, f"[localhost r{rank}] rank {rank} line {FIRST - 1:06d}", 120)
        ballast.unlink()  # 1 MiB back: room for status.json and the combined log, not the ranks
        (tmp_path / "go").touch()
        text = finish(proc, out)
        runs_flag = ["--run-dir", str(runs)]
        status = status_of(runs, "short")
        incomplete = sorted(entry["rank"] for entry in status["incomplete_logs"])
        assert incomplete and set(incomplete) <= {0, 1}
        listed = ", ".join(map(str, incomplete))
        fetch = f"run 'orchestrator logs short --fetch --run-dir {runs}' when there is space"
        assert f"{listed} {'is' if len(incomplete) == 1 else 'are'} incomplete: {fetch}" in text
        assert status["state"] == "succeeded" and status["node_copies"].startswith("kept")
        logs = runs / "short" / "logs"
        before = {rank: (logs / f"rank-{rank}.log").read_bytes() for rank in (0, 1)}

        still_short = run_cli(["logs", "short", "--fetch", *runs_flag], env=env(tmp_path))
        assert still_short.returncode == 1, still_short.stderr
        assert "No space left on device" in still_short.stderr
        assert "Traceback" not in still_short.stderr
        assert {rank: (logs / f"rank-{rank}.log").read_bytes() for rank in (0, 1)} == before
        assert status_of(runs, "short")["incomplete_logs"] == status["incomplete_logs"]

        node_copy = tmp_path / "home" / ".orchestrator" / "runs" / "short"
        node_copy.rename(node_copy.with_name("moved"))
        gone = run_cli(["logs", "short", "--fetch", *runs_flag], env=env(tmp_path))
        assert gone.returncode == 2 and "the node's copy is gone" in gone.stderr, gone.stderr
        assert "Traceback" not in gone.stderr
        node_copy.with_name("moved").rename(node_copy)

        resize(runs, "64m")
        fetched = run_cli(["logs", "short", "--fetch", *runs_flag], env=env(tmp_path))
        assert fetched.returncode == 0, fetched.stderr
        for rank in incomplete:
            assert f"rank-{rank}.log: completed from localhost:" in fetched.stdout
        for rank in (0, 1):
            assert (logs / f"rank-{rank}.log").read_text() == printed(rank), rank
        assert "incomplete_logs" not in status_of(runs, "short")

        again = run_cli(["logs", "short", "--fetch", *runs_flag], env=env(tmp_path))
        assert again.returncode == 2 and "nothing to fetch" in again.stderr, again.stderr
        one = run_cli(["logs", "short", "--rank", "1", *runs_flag])
        assert one.returncode == 0 and one.stdout == printed(1)
