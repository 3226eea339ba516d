"""End to end on this machine: the real CLI, real torchrun, the real trainer, 2 local ranks."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import (
    ORCHESTRATOR,
    REPO,
    SPLICE,
    assert_nothing_left,
    check_lines,
    run_cli,
    run_on_terminal,
    start_cli,
    status_of,
    wait_for_line,
)
from tests.goodput_helpers import assert_goodput

LOCAL = str(REPO / "hostfiles" / "local.txt")

ALLREDUCE = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([rank + 1.0])
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    print(f"rank {rank} of {world}: sum {value.item():g} (expected {expected:g}) "
          f"args {sys.argv[1:]}")
    print(f"rank {rank} to stderr", file=sys.stderr)
    dist.destroy_process_group()
    sys.exit(0 if value.item() == expected else 1)
""")

FAIL_ON_RANK_1 = textwrap.dedent("""
    import os, sys, time
    rank = int(os.environ["RANK"])
    print(f"rank {rank} working", flush=True)
    if rank == 1:
        time.sleep(1)
        print("rank 1 is about to fail", flush=True)
        sys.exit(3)
    time.sleep(60)
""")

SLEEPER = textwrap.dedent("""
    import os, signal, sys, time
    rank = int(os.environ["RANK"])
    if os.environ.get("IGNORE_TERM") == str(rank):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"rank {rank} ready", flush=True)
    for i in range(int(os.environ.get("TICKS", "600"))):
        print(f"rank {rank} tick {i}", flush=True)
        time.sleep(0.1)
""")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def launch(tmp_path: Path, run_id: str, *args: str, timeout: float = 240, env=None):
    return run_cli(
        [
            "launch",
            LOCAL,
            "--run-dir",
            str(tmp_path / "runs"),
            "--run-id",
            run_id,
            "--color",
            "never",
            *args,
        ],
        cwd=tmp_path,
        env=env,
        timeout=timeout,
    )


def test_bundled_trainer_trains_and_the_run_is_recorded(tmp_path: Path) -> None:
    # A temporary folder of this run's own, where torchrun would make its torchelastic_*
    # folder if not given one (this machine's /tmp is shared with other runs, the lab's too).
    temp = tmp_path / "tmp"
    temp.mkdir()
    checkpoints = tmp_path / "ckpt"
    trainer = ["--", "-m", "orchestrator.trainer", "--checkpoint-dir", str(checkpoints)]
    trainer += ["--checkpoint-every", "50"]  # the bundled trainer's own run, saved 4 times
    done = launch(tmp_path, "demo", *trainer, env={**os.environ, "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    losses = [
        float(x) for x in re.findall(r"^\[localhost r0\] step \d+/\d+ .*loss ([\d.]+)", out, re.M)
    ]
    assert len(losses) >= 3, out
    assert losses[-1] < losses[0] / 2, f"loss did not fall: {losses}"
    assert re.search(r"^\[localhost r0\] .*samples/s \d+", out, re.M)
    assert re.search(r"^\[localhost r0\] done: ", out, re.M)
    assert re.search(r"^\[localhost r1\] ", out, re.M)
    assert "run demo succeeded" in out

    record = tmp_path / "runs" / "demo"
    plan = yaml.safe_load((record / "plan.yaml").read_text())
    assert plan["world_size"] == 2 and plan["nodes"][0]["nproc"] == 2
    assert (record / "node0.sh").stat().st_mode & 0o100
    status = status_of(tmp_path / "runs", "demo")
    assert status["state"] == "succeeded" and status["exit_code"] == 0
    assert status["started_at"] and status["ended_at"]
    assert [n["exit_code"] for n in status["nodes"]] == [0]
    assert [(r["rank"], r["exit_code"], r["state"]) for r in status["ranks"]] == [
        (0, 0, "succeeded"),
        (1, 0, "succeeded"),
    ]
    assert all(r["ended_at"] for r in status["ranks"])
    rank0 = (record / "logs" / "rank-0.log").read_text()
    assert re.search(r"^done: ", rank0, re.M), "per-rank log holds the rank's own lines"
    combined = (record / "logs" / "combined.log").read_text()
    assert re.search(r"^\[localhost r0\] done: ", combined, re.M)
    assert_nothing_left("demo")
    # torchrun kept its own folder in the node's copy of the run, removed with it
    assert list(temp.glob("torchelastic_*")) == [], "torchrun left its folder in TMPDIR"
    assert not (Path(os.environ["HOME"]) / ".orchestrator" / "runs" / "demo").exists()
    # Where its wall time went: every step kept, its four saves timed, nothing redone.
    goodput = assert_goodput(tmp_path / "runs", "demo", out)
    assert goodput["steps"] and goodput["redone_steps"] == 0 and goodput["faults"]["count"] == 0
    assert goodput["attempts"][0]["steps"] == [0, 200], goodput
    assert 0 < goodput["phases"]["checkpoints"] < goodput["phases"]["training"], goodput
    assert sorted(p.name for p in checkpoints.glob("ckpt-*.pt"))[-1] == "ckpt-00000200.pt"


def test_user_script_with_arguments_runs_under_torchrun(tmp_path: Path) -> None:
    write(tmp_path, "train.py", ALLREDUCE)
    done = launch(tmp_path, "user", "--", "train.py", "--lr", "0.1")
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert re.search(
            rf"^\[localhost r{rank}\] rank {rank} of 2: sum 3 \(expected 3\) "
            r"args \['--lr', '0.1'\]$",
            done.stdout,
            re.M,
        ), done.stdout
        assert f"[localhost r{rank}] rank {rank} to stderr" in done.stdout
        own = (tmp_path / "runs" / "user" / "logs" / f"rank-{rank}.log").read_text()
        assert f"rank {rank} of 2: sum 3" in own and f"rank {1 - rank} of" not in own


def test_failing_rank_is_named_with_its_code_and_last_lines(tmp_path: Path) -> None:
    write(tmp_path, "fail.py", FAIL_ON_RANK_1)
    started = time.monotonic()
    done = launch(tmp_path, "fails", "--grace", "3", "--", "fail.py")
    assert done.returncode == 3, done.stdout + done.stderr
    assert time.monotonic() - started < 50, "rank 0 must be stopped, not waited for"
    assert re.search(
        r"job failed: rank 1 \(local rank 1\) on localhost ended with exit code 3", done.stdout
    ), done.stdout
    summary = done.stdout[done.stdout.index("job failed") :]
    assert "rank 1 is about to fail" in summary
    status = status_of(tmp_path / "runs", "fails")
    assert status["state"] == "failed" and status["exit_code"] == 3
    ranks = {r["rank"]: r for r in status["ranks"]}
    assert ranks[1]["state"] == "failed" and ranks[1]["exit_code"] == 3
    assert ranks[0]["state"] in ("stopped", "killed")
    assert_nothing_left("fails")


def test_rank_lines_are_never_spliced_and_none_is_lost(tmp_path: Path) -> None:
    lines = 3000
    write(tmp_path, "chatty.py", SPLICE.replace("LINES", str(lines)).replace("MAXLEN", "4000"))
    done = launch(tmp_path, "chatty", "--", "chatty.py")
    assert done.returncode == 0, done.stderr
    logs = tmp_path / "runs" / "chatty" / "logs"
    combined = (logs / "combined.log").read_text().splitlines()
    for rank in (0, 1):
        check_lines((logs / f"rank-{rank}.log").read_text().splitlines(), rank, lines)
        prefix = f"[localhost r{rank}] "
        check_lines([x[len(prefix) :] for x in combined if x.startswith(prefix)], rank, lines)
        console = [x[len(prefix) :] for x in done.stdout.splitlines() if x.startswith(prefix)]
        check_lines(console, rank, lines)


def test_logs_command_reads_the_run_record(tmp_path: Path) -> None:
    write(tmp_path, "train.py", ALLREDUCE)
    assert launch(tmp_path, "logged", "--", "train.py").returncode == 0
    runs = ["--run-dir", str(tmp_path / "runs")]
    logs = tmp_path / "runs" / "logged" / "logs"
    whole = run_cli(["logs", "logged", *runs])
    assert whole.returncode == 0 and whole.stdout == (logs / "combined.log").read_text()
    one = run_cli(["logs", "logged", "--rank", "1", *runs])
    assert one.stdout == (logs / "rank-1.log").read_text()
    grep = run_cli(["logs", "logged", "--grep", "to stderr", *runs])
    assert sorted(grep.stdout.splitlines()) == [
        "[localhost r0] rank 0 to stderr",
        "[localhost r1] rank 1 to stderr",
    ]
    tail = run_cli(["logs", "logged", "--tail", "1", *runs])
    assert tail.stdout.splitlines() == whole.stdout.splitlines()[-1:]
    bad = run_cli(["logs", "logged", "--rank", "7", *runs])
    assert bad.returncode == 2 and "ranks 0-1" in bad.stderr
    missing = run_cli(["logs", "nope", *runs])
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr


def test_detached_run_can_be_followed_inspected_and_stopped(tmp_path: Path) -> None:
    write(tmp_path, "sleeper.py", SLEEPER)
    runs = ["--run-dir", str(tmp_path / "runs")]
    started = launch(tmp_path, "bg", "--detach", "--", "sleeper.py")
    assert started.returncode == 0, started.stdout + started.stderr
    assert "run bg started in the background" in started.stdout
    rank_log = tmp_path / "runs" / "bg" / "logs" / "rank-1.log"
    wait_for_line(rank_log, "rank 1 tick 3", 60)

    follower = start_cli(["logs", "bg", "-f", "--rank", "1", *runs])
    status = run_cli(["status", "bg", *runs])
    assert status.returncode == 0
    assert re.search(r"run bg: running", status.stdout), status.stdout
    assert re.search(r"^1\s+localhost\s+1\s+running", status.stdout, re.M), status.stdout
    listing = run_cli(["runs", *runs])
    assert re.search(r"^bg\s+running\s+local", listing.stdout, re.M), listing.stdout

    stopped = run_cli(["stop", "bg", *runs])
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stdout
    followed, _ = follower.communicate(timeout=30)  # ends by itself once the run has ended
    assert "rank 1 ready" in followed and "rank 1 tick 3" in followed
    assert followed.splitlines()[-1].startswith("rank 1 tick") or "Terminated" in followed
    final = status_of(tmp_path / "runs", "bg")
    assert final["state"] == "stopped" and final["exit_code"] == 128 + signal.SIGTERM
    assert_nothing_left("bg")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_every_rank(tmp_path: Path, signum: int) -> None:
    write(tmp_path, "sleeper.py", SLEEPER)
    run_id = f"int{int(signum)}"
    proc = start_cli(
        [
            "launch",
            LOCAL,
            "--run-dir",
            str(tmp_path / "runs"),
            "--run-id",
            run_id,
            "--color",
            "never",
            "--",
            "sleeper.py",
        ],
        cwd=tmp_path,
    )
    wait_for_line(tmp_path / "runs" / run_id / "logs" / "rank-1.log", "rank 1 ready", 60)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum, out
    assert f"{signal.Signals(signum).name}: stopping the run on every node" in out
    assert status_of(tmp_path / "runs", run_id)["state"] == "stopped"
    assert_nothing_left(run_id, within=2)


def test_rank_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    write(tmp_path, "sleeper.py", SLEEPER)
    proc = start_cli(
        [
            "launch",
            LOCAL,
            "--run-dir",
            str(tmp_path / "runs"),
            "--run-id",
            "stub",
            "--color",
            "never",
            "--grace",
            "2",
            "--env",
            "IGNORE_TERM=1",
            "--",
            "sleeper.py",
        ],
        cwd=tmp_path,
    )
    wait_for_line(tmp_path / "runs" / "stub" / "logs" / "rank-1.log", "rank 1 ready", 60)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == 130, out
    assert "SIGKILL to" in out, out
    assert 2 <= took < 10, f"stop took {took:.1f} s with a 2 s grace"
    ranks = {r["rank"]: r for r in status_of(tmp_path / "runs", "stub")["ranks"]}
    assert ranks[0]["state"] == "stopped" and ranks[0]["exit_code"] == 143
    assert ranks[1]["state"] == "killed"
    assert_nothing_left("stub", within=2)


def test_render_writes_scripts_that_run_by_hand(tmp_path: Path) -> None:
    write(tmp_path, "train.py", ALLREDUCE)
    out_dir = tmp_path / "rendered"
    done = run_cli(
        ["render", LOCAL, "-o", str(out_dir), "--run-id", "byhand", "--", "train.py"], cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["node0.sh", "plan.yaml"]
    script = out_dir / "node0.sh"
    assert script.stat().st_mode & 0o100
    assert "orchestrator render" in script.read_text().splitlines()[1]
    by_hand = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120)
    assert by_hand.returncode == 0, by_hand.stdout + by_hand.stderr
    assert "rank 0 of 2: sum 3" in by_hand.stdout and "rank 1 of 2: sum 3" in by_hand.stdout


def test_dry_run_shows_plan_and_scripts_and_starts_nothing(tmp_path: Path) -> None:
    write(tmp_path, "train.py", ALLREDUCE)
    done = launch(tmp_path, "dry", "--dry-run", "--env", "FOO=bar baz", "--", "train.py")
    assert done.returncode == 0, done.stderr
    assert "# plan.yaml" in done.stdout and "world_size: 2" in done.stdout
    assert "# ---- node0.sh (runs on localhost) ----" in done.stdout
    assert "export FOO='bar baz'" in done.stdout
    assert "-m torch.distributed.run" in done.stdout
    assert not (tmp_path / "runs" / "dry").exists()


def test_a_secret_the_local_job_inherits_is_masked_in_its_output(tmp_path: Path) -> None:
    """HF_TOKEN=... orchestrator launch local.txt: the ranks inherit this shell's environment,
    so its secret-named variables are masked as --env secrets are."""
    write(
        tmp_path,
        "show.py",
        "import os\nprint('token', os.environ['HF_TOKEN'], 'parallelism',"
        " os.environ['TOKENIZERS_PARALLELISM'], flush=True)\n",
    )
    token = "hf_abcdefghijklmnop"
    done = run_cli(
        ["launch", LOCAL, "--run-dir", str(tmp_path / "runs"), "--run-id", "inherited"]
        + ["--color", "never", "--", "show.py"],
        cwd=tmp_path,
        env={**os.environ, "HF_TOKEN": token, "TOKENIZERS_PARALLELISM": "false"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # A short value of a token-named setting is no secret: it stays as it is. (Both ranks
    # print it: the console shows it once for both.)
    assert "[localhost r[0-1]] token *** parallelism false" in done.stdout, done.stdout
    assert token not in done.stdout + done.stderr
    for path in (tmp_path / "runs" / "inherited").rglob("*"):
        if path.is_file():
            assert token not in path.read_text(errors="replace"), path


def test_each_rank_gets_its_share_of_the_cores_unless_omp_num_threads_is_set(
    tmp_path: Path,
) -> None:
    write(tmp_path, "threads.py", "import os; print('threads', os.environ['OMP_NUM_THREADS'])\n")
    share = max(1, len(os.sched_getaffinity(0)) // 2)  # the hostfile's 2 ranks on this machine
    done = launch(tmp_path, "threads", "--", "threads.py")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    # both ranks print the same line: the console folds it, the rank files keep it
    assert f"[localhost r[0-1]] threads {share}\n" in out, out
    for rank in (0, 1):
        logs = tmp_path / "runs" / "threads" / "logs" / f"rank-{rank}.log"
        assert logs.read_text() == f"threads {share}\n"
    assert "Setting OMP_NUM_THREADS" not in out, out  # torchrun's banner: it chose nothing
    plan = (tmp_path / "runs" / "threads" / "plan.yaml").read_text()
    assert "its usable cores / 2 local ranks" in plan, plan
    chosen = run_cli(
        ["launch", LOCAL, "--run-dir", str(tmp_path / "runs"), "--run-id", "chosen",
         "--no-fold", "--", "threads.py"],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "3"},
    )  # fmt: skip
    for rank in (0, 1):  # --no-fold: every line as printed
        assert f"[localhost r{rank}] threads 3\n" in chosen.stdout, chosen.stdout + chosen.stderr


def test_on_a_terminal_the_start_shows_one_live_progress_line(tmp_path: Path) -> None:
    write(tmp_path, "hello.py", "print('hello', flush=True)\n")
    argv = ["launch", LOCAL, "--run-dir", str(tmp_path / "runs"), "--run-id", "tty"]
    code, seen = run_on_terminal([*ORCHESTRATOR, *argv, "--", "hello.py"], cwd=tmp_path)
    assert code == 0, seen.decode(errors="replace")
    assert b"\r\x1b[K[orchestrator] probing: 1/1 nodes" in seen, seen
    assert b"\r\x1b[K[orchestrator] starting: 1/1 nodes" in seen, seen
    # Not on a terminal, a start this quick prints no progress at all.
    done = launch(tmp_path, "pipe", "--", "hello.py")
    assert done.returncode == 0 and " nodes\n" not in done.stdout, done.stdout
