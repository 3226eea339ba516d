"""The parts of following a SLURM job that need no SLURM: streaming an attempt's files
(orchestrator.slurm.following.stream) and deciding how the job ended
(orchestrator.slurm.recovery.outcome). The whole path runs against real SLURM in
test_slurm_cluster.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from orchestrator.options.supervision import Supervision
from orchestrator.slurm.control.parse import JobInfo
from orchestrator.slurm.following.stream import AttemptFiles, read_fields
from orchestrator.slurm.recovery.outcome import job_outcome
from orchestrator.supervise import Supervisor
from tests.factories import supervisor


def attempt(tmp_path: Path, nnodes: int = 2, nproc: int = 1, max_restarts: int = 0) -> Supervisor:
    """As the follower builds one for an attempt: no sessions, SLURM stops the nodes."""
    return supervisor(
        tmp_path / "logs",
        [f"n{k}" for k in range(nnodes)],
        nproc,
        label="{host} r{rank}",
        supervision=Supervision(grace=0, heartbeat_timeout=0, hang_timeout=0),
        stop_on_failure=False,
        max_restarts=max_restarts,
    )


def write(path: Path, text: str, written_at: float | None = None) -> None:
    """Append `text`; `written_at` sets the file's modification time, which is what the
    follower times starts and exits by (one clock for all nodes: the file system's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(text)
    if written_at is not None:
        os.utime(path, (written_at, written_at))


def approx(values):
    """Exits or a time, equal to within the error of the measured file system clock."""
    if isinstance(values, float):
        return pytest.approx(values, abs=0.05)
    return [(rank, code, pytest.approx(when, abs=0.05)) for rank, code, when in values]


# --- streaming ---------------------------------------------------------------------------


def test_an_attempt_streams_output_then_starts_and_exits_in_the_order_they_happened(
    tmp_path: Path,
) -> None:
    sup = attempt(tmp_path)
    files = AttemptFiles(tmp_path / "attempt0", nnodes=2, nproc=1)
    exits: list[tuple[int, int, float]] = []

    def pump() -> bool:
        came = files.pump(
            sup.sink,
            sup,
            lambda *exit: (exits.append(exit), sup.rank_exited(*exit)),
            sup.node_exited,
        )
        sup.sink.flush()
        return came

    assert not pump()  # nothing written yet (the node directories do not even exist)
    assert [n.state for n in sup.nodes] == ["starting", "starting"] and exits == []
    write(files.node_dir(0) / "node.start", "123 10.5\n", 10.5)
    write(files.node_dir(0) / "node.out", "torchrun says\n")
    write(files.node_dir(0) / "rank-0.out", "step 1\nhalf a li")
    write(files.node_dir(1) / "node.start", "124 10")  # not complete yet
    assert pump()  # something came: the follower reads again soon
    assert sup.nodes[0].state == "running" and sup.nodes[0].started_at == approx(10.5)
    assert sup.ranks[0].state == "running" and sup.nodes[1].state == "starting"
    write(files.node_dir(1) / "node.start", ".7\n", 10.7)
    write(files.node_dir(0) / "rank-0.out", "ne")
    write(files.node_dir(0) / "rank-0.exit", f"3 12.0 {tmp_path / 'error.json'}\n", 12.0)
    write(tmp_path / "error.json", '{"message": "boom"}')
    write(files.node_dir(1) / "rank-1.exit", "0 11.0\n", 11.0)
    pump()
    assert exits == approx([(1, 0, 11.0), (0, 3, 12.0)])  # by the time they ended
    assert sup.ranks[0].error_file == '{"message": "boom"}'
    assert (tmp_path / "logs" / "rank-0.log").read_text() == "step 1\nhalf a line\n"
    assert (tmp_path / "logs" / "node-0.log").read_text() == "torchrun says\n"
    write(files.node_dir(0) / "node.exit", "3 12.5\n", 12.5)
    assert pump()
    assert not pump()  # nothing new: the follower reads less often
    assert exits == approx([(1, 0, 11.0), (0, 3, 12.0)])  # each exit once
    assert sup.nodes[0].done and sup.nodes[0].exit_code == 3 and not sup.nodes[1].done
    files.close()
    sup.sink.close()


def test_a_completed_job_settles_the_exits_its_agents_could_not_bring(tmp_path: Path) -> None:
    """SLURM cancelled the dial to node 1 before its agent's last frames came: its exit
    files say how its rank and its part ended; nothing heard before is passed on again, and
    no output is read (it came through the agents)."""
    sup = attempt(tmp_path)
    files = AttemptFiles(tmp_path / "attempt0", nnodes=2, nproc=1)
    sup.rank_exited(0, 0, 11.0)
    sup.node_exited(sup.nodes[0], 0, 11.5)
    write(files.node_dir(0) / "rank-0.exit", "0 11.0\n", 11.0)
    write(files.node_dir(1) / "rank-1.out", "a line the agent brought\n")
    write(files.node_dir(1) / "rank-1.exit", "0 12.0\n", 12.0)
    write(files.node_dir(1) / "node.exit", "0 12.5\n", 12.5)
    exits: list[tuple[int, int, float]] = []
    files.settle(sup, lambda *exit: (exits.append(exit), sup.rank_exited(*exit)), sup.node_exited)
    assert exits == approx([(1, 0, 12.0)])
    assert sup.nodes[1].done and sup.nodes[1].exit_code == 0
    assert sup.outcome().state == "succeeded"
    sup.sink.close()
    assert (
        not (tmp_path / "logs" / "rank-1.log").exists()
        or not (tmp_path / "logs" / "rank-1.log").read_text()
    )


def test_a_rank_exit_waits_until_its_output_is_read(tmp_path: Path) -> None:
    sup = attempt(tmp_path, nnodes=1)
    files = AttemptFiles(tmp_path / "attempt1", nnodes=1, nproc=1)
    write(files.node_dir(0) / "rank-0.exit", "0 5.0\n")
    write(files.node_dir(0) / "rank-0.out", "x" * (3 << 20) + "\n")  # more than one pump reads
    exits: list[tuple[int, int, float]] = []
    files.pump(sup.sink, sup, lambda *exit: exits.append(exit), sup.node_exited)
    assert exits == []
    while not exits:
        files.pump(sup.sink, sup, lambda *exit: exits.append(exit), sup.node_exited)
    sup.sink.close()
    assert (tmp_path / "logs" / "rank-0.log").stat().st_size == (3 << 20) + 1


def test_a_rewritten_rank_exit_is_the_ranks_next_run_ending(tmp_path: Path) -> None:
    """--max-restarts: run_rank rewrites rank-R.exit each time torchrun's restart of the rank
    ends; each new line is passed on once, and output after a failure means it runs again."""
    sup = attempt(tmp_path, nnodes=1, nproc=2, max_restarts=1)
    files = AttemptFiles(tmp_path / "attempt0", nnodes=1, nproc=2)
    exits: list[tuple[int, int, float]] = []

    def pump() -> None:
        files.pump(
            sup.sink,
            sup,
            lambda *exit: (exits.append(exit), sup.rank_exited(*exit)),
            sup.node_exited,
        )

    node = files.node_dir(0)
    write(node / "node.start", "1 1.0\n", 1.0)
    write(node / "rank-1.out", "rank 1 crashing\n")
    write(node / "rank-1.exit", "3 2.0 \n", 2.0)
    write(node / "rank-0.out", "rank 0 step 5\n")
    write(node / "rank-0.exit", "143 2.1 \n", 2.1)  # torchrun stopped it to restart
    pump()
    pump()
    assert exits == approx([(1, 3, 2.0), (0, 143, 2.1)])
    assert [sup.ranks[r].state for r in (0, 1)] == ["restarting", "restarting"]
    write(node / "rank-1.out", "rank 1 resumed\n")
    pump()
    assert sup.ranks[1].state == "running" and sup.ranks[0].state == "restarting"
    (node / "rank-1.exit").write_text("0 9.0 \n")
    os.utime(node / "rank-1.exit", (9.0, 9.0))
    (node / "rank-0.exit").write_text("0 9.5 \n")
    os.utime(node / "rank-0.exit", (9.5, 9.5))
    pump()
    pump()
    assert exits[2:] == approx([(1, 0, 9.0), (0, 0, 9.5)])
    write(node / "node.exit", "0 10.0\n", 10.0)
    pump()
    outcome = job_outcome(7, JobInfo("COMPLETED", exit_code=0), sup, None, tmp_path / "none")
    assert (outcome.state, outcome.exit_code) == ("succeeded", 0)
    lines = outcome.summary.splitlines()
    assert lines[0] == "restarted 1 time(s) (--max-restarts 1):"
    assert lines[1].startswith("  restart 1: rank 1 on n0 ended with exit code 3 after ")
    assert sup.status()["restarts"] == 1
    sup.sink.flush()
    assert (tmp_path / "logs" / "rank-1.log").read_text() == "rank 1 crashing\nrank 1 resumed\n"
    files.close()
    sup.sink.close()


@pytest.mark.parametrize(
    ("text", "fields"), [("0 1.5\n", ["0", "1.5"]), ("0 1.5", None), ("\n", None), (None, None)]
)
def test_read_fields(tmp_path: Path, text, fields) -> None:
    path = tmp_path / "node.exit"
    if text is not None:
        path.write_text(text)
    assert read_fields(path) == fields
    assert read_fields(path / "below a file") is None


# --- the outcome -------------------------------------------------------------------------


def test_a_completed_job_whose_ranks_succeeded_succeeded(tmp_path: Path) -> None:
    sup = attempt(tmp_path)
    for node in sup.nodes:
        for rank in node.ranks:
            sup.rank_exited(rank, 0, 5.0)
        sup.node_exited(node, 0, 6.0)
    outcome = job_outcome(7, JobInfo("COMPLETED", exit_code=0), sup, None, tmp_path / "none")
    assert (outcome.state, outcome.exit_code) == ("succeeded", 0)


def test_slurm_ending_the_job_is_said_first_and_nodes_left_are_settled(tmp_path: Path) -> None:
    sup = attempt(tmp_path)
    sup.nodes[0].started_at = 1.0
    outcome = job_outcome(7, JobInfo("TIMEOUT", exit_code=0), sup, None, tmp_path / "none")
    assert (outcome.state, outcome.exit_code) == ("failed", 1)
    assert outcome.summary.startswith(
        "job ended: SLURM job 7 ended TIMEOUT: it reached its time limit (--time)"
    )
    assert all(
        n.done and n.state == "failed" and n.detail == "ended by SLURM (job TIMEOUT)"
        for n in sup.nodes
    )
    assert {r.state for r in sup.ranks.values()} == {"unknown"}
    cancelled = job_outcome(7, JobInfo("CANCELLED", exit_code=15), None, None, tmp_path)
    assert (cancelled.state, cancelled.exit_code) == ("stopped", 15)


def test_the_first_failing_rank_decides_a_failed_job(tmp_path: Path) -> None:
    sup = attempt(tmp_path)
    sup.nodes[0].started_at = 1.0
    sup.rank_exited(1, 4, 9.0)
    sup.rank_exited(0, 3, 8.0)
    outcome = job_outcome(7, JobInfo("FAILED", exit_code=3), sup, None, tmp_path / "none")
    assert (outcome.state, outcome.exit_code) == ("failed", 3)
    assert outcome.summary.startswith("job failed: rank 0 (local rank 0) on n0 ended with")


def test_a_job_that_failed_before_its_ranks_shows_the_batch_output(tmp_path: Path) -> None:
    batch = tmp_path / "slurm-7.out"
    batch.write_text("".join(f"line {i}\n" for i in range(30)))
    outcome = job_outcome(7, JobInfo("FAILED", exit_code=2), attempt(tmp_path), None, batch)
    assert (outcome.state, outcome.exit_code) == ("failed", 2)
    lines = outcome.summary.splitlines()
    assert lines[0] == (
        "job failed: SLURM job 7 ended FAILED with exit code 2 before any node started its ranks"
    )
    assert lines[1] == f"last 20 line(s) of {batch}:" and lines[-1] == "  line 29"


def test_an_interrupted_follow_is_stopped_by_its_signal(tmp_path: Path) -> None:
    sup = attempt(tmp_path)
    outcome = job_outcome(7, JobInfo("CANCELLED"), sup, signal.SIGINT, tmp_path / "none")
    assert (outcome.state, outcome.exit_code) == ("stopped", 130)
    assert outcome.summary == "stopped by SIGINT: SLURM job 7 cancelled"
    assert sup.stopper.interrupted_by == signal.SIGINT
