"""What a SLURM run's controller leaves for the next (orchestrator.slurm.following.handover) and
what `attach` checks first (orchestrator.slurm.attach): the job read back as planned, the read
points, logs cut back to them, one follower at a time, and the refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.agent.ranks import RankFile
from orchestrator.errors import ConfigError
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.options.supervision import Supervision
from orchestrator.plan.container import ContainerSpec
from orchestrator.plan.spec import JobSpec, Program
from orchestrator.record.plain import from_plain, to_plain
from orchestrator.record.runs import RunRecord, new_status, this_controller
from orchestrator.slurm.attach import check_attachable
from orchestrator.slurm.batch.job import SlurmJob
from orchestrator.slurm.batch.planning import plan_slurm_job
from orchestrator.slurm.following.agents import NodeDial
from orchestrator.slurm.following.handover import (
    POINTS_FILE,
    STATE_FILE,
    Following,
    Points,
    cut_logs,
    hold_lock,
    load,
    save_points,
)


def planned(**container: object) -> SlurmJob:
    spec = JobSpec(
        program=Program.from_argv(("train.py", "--lr", "0.1")),
        python="/opt/venv/bin/python",
        workdir="/home/alice/project",
        env=(("WANDB_API_KEY", "s3cret"), ("NCCL_DEBUG", "INFO")),
        container=ContainerSpec(**container) if container else None,
    )
    options = SlurmOptions(nodes=2, time="1:00:00", max_resubmits=2)
    return plan_slurm_job(spec, options, "r1", job_dir="/runs/r1/nodes")


@pytest.mark.parametrize("container", [{}, {"image": "/images/pytorch.sif"}])
def test_a_job_reads_back_as_planned_through_json(container: dict) -> None:
    job = planned(**container)
    text = json.dumps(to_plain(job))
    assert from_plain(SlurmJob, json.loads(text)) == job
    assert "s3cret" not in text  # a secret's value is never in the job


def test_a_value_that_does_not_fit_its_type_is_refused() -> None:
    data = to_plain(planned())
    data["nnodes"] = "two"
    with pytest.raises(ValueError, match="expected int"):
        from_plain(SlurmJob, data)


def test_points_hold_for_their_attempt_only() -> None:
    points = Points(7, 0, 120, {"node0/rank-0.out": 55}, {"0": 900}, {"combined.log": 10})
    assert points.of(7, 0) is points
    assert points.of(7, 1) == Points(7, 1, 120)  # requeued: the same batch output goes on
    assert points.of(8, 0) == Points(8, 0, 0)  # another job: from the start


def test_logs_are_cut_back_to_the_points_and_new_ones_emptied(tmp_path: Path) -> None:
    (tmp_path / "rank-0.log").write_bytes(b"a\nb\nc\n")
    (tmp_path / "combined.log").write_bytes(b"x\n")
    (tmp_path / "rank-1.log").write_bytes(b"begun after the points\n")
    cut_logs(tmp_path, Points(logs={"rank-0.log": 4, "combined.log": 2}))
    assert (tmp_path / "rank-0.log").read_bytes() == b"a\nb\n"
    assert (tmp_path / "combined.log").read_bytes() == b"x\n"
    assert (tmp_path / "rank-1.log").read_bytes() == b""


def test_a_tail_resumes_at_its_position_with_a_partial_line_read_again(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.out"
    path.write_bytes(b"one\ntw")
    tail = RankFile(0, str(path))
    assert tail.read_lines(1 << 20) == b"one\n"
    assert tail.position() == 4  # "tw" is not passed on yet
    with path.open("ab") as handle:
        handle.write(b"o\nthree\n")
    again = RankFile(0, str(path))
    again.seek(tail.position())
    assert again.read_lines(1 << 20) == b"two\nthree\n"


def test_a_nodes_stream_starts_where_the_keeper_says() -> None:
    channel = NodeDial(None, 0)  # type: ignore[arg-type]
    assert channel.take(b"at 40") == b"" and not channel.connected  # the line, in parts
    assert channel.take(b"96 128\nH 1.0\n") == b"H 1.0\n"
    assert (channel.start, channel.lost, channel.connected) == (4096, 128, True)
    assert channel.take(b"at 0 0\n") == b"at 0 0\n"  # the agent's bytes from then on


def record_of(tmp_path: Path, backend: str = "slurm", **status: object) -> RunRecord:
    record = RunRecord.create(tmp_path, "r1")
    record.write_status({**new_status("r1", backend, "c", "p", 2, 2, "m"), **status})
    return record


def test_one_follower_at_a_time(tmp_path: Path) -> None:
    record = record_of(tmp_path)
    held = hold_lock(record)
    try:
        with pytest.raises(ConfigError, match="followed by another controller"):
            hold_lock(record)
    finally:
        os.close(held)
    os.close(hold_lock(record))  # free again once its holder let go


def test_attach_refuses_what_it_cannot_take_over(tmp_path: Path) -> None:
    gone = {"pid": 2**22 + 17, "start_time": 1, "host": "login1"}
    with pytest.raises(ConfigError, match="ran over SSH"):
        check_attachable(record_of(tmp_path / "a", "ssh", state="running", controller=gone))
    with pytest.raises(ConfigError, match=r"has ended \(failed\)"):
        check_attachable(record_of(tmp_path / "b", state="failed", controller=gone))
    alive = record_of(tmp_path / "c", state="running", controller=this_controller())
    with pytest.raises(ConfigError, match=f"followed by its controller \\(pid {os.getpid()}"):
        check_attachable(alive)
    lost = record_of(tmp_path / "d", state="running", controller=gone)
    assert check_attachable(lost)["state"] == "running"
    with pytest.raises(ConfigError, match=f"{STATE_FILE} is missing"):
        load(lost)


def test_a_handover_reads_back(tmp_path: Path) -> None:
    from orchestrator.slurm.following.handover import Progress, save_state
    from orchestrator.slurm.recovery.job_attempts import JobAttempts

    record = record_of(tmp_path)
    following = Following("orchestrator launch ...", None, None, Supervision(), True, False, None)
    base = {"run_id": "r1", "slurm_job_id": 42}
    progress = Progress(planned(), 42, "/runs/r1/nodes", base, JobAttempts(42, 2), None)

    save_state(record, following, progress)
    save_points(record, Points(42, 0, 9, {"node0/rank-0.out": 3}, {"0": 77}, {"rank-0.log": 3}))
    handover = load(record)
    assert (handover.job, handover.job_id, handover.following) == (planned(), 42, following)
    assert handover.points.agents == {"0": 77} and handover.base["slurm_job_id"] == 42
    attempts = JobAttempts(1, 0)
    handover.restore_attempts(attempts)
    assert [s.job_id for s in attempts.entries] == [42] and attempts.left == 2
    (record.path / POINTS_FILE).write_text("{")
    with pytest.raises(ConfigError, match="cannot read it"):
        load(record)


def test_a_handover_an_older_orchestrator_wrote_reads_back(tmp_path: Path) -> None:
    """Before SLURM's jobs were attempts, follower.json kept them under `segments`."""
    from orchestrator.slurm.following.handover import Progress, save_state
    from orchestrator.slurm.recovery.job_attempts import JobAttempts

    record = record_of(tmp_path)
    following = Following("orchestrator launch ...", None, None, Supervision(), True, False, None)
    kept = JobAttempts(42, 2)
    kept.resubmitted(43)
    save_state(record, following, Progress(planned(), 43, None, {}, kept, None))
    state = json.loads((record.path / STATE_FILE).read_text())
    state["segments"] = state.pop("attempts")
    (record.path / STATE_FILE).write_text(json.dumps(state))
    attempts = JobAttempts(1, 0)
    load(record).restore_attempts(attempts)
    assert [(a.number, a.job_id) for a in attempts.entries] == [(1, 42), (2, 43)]
    del state["segments"]
    (record.path / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(ConfigError, match="not a follower state this orchestrator reads"):
        load(record)
