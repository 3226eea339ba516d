"""The SLURM follower as the one loop's watch (orchestrator.supervise.run_loop): a job
followed from the queue to its end with SLURM's commands answered at the boundary."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.options.scheduler import SlurmOptions
from orchestrator.record.runs import RunRecord
from orchestrator.slurm.batch.planning import plan_slurm_job
from orchestrator.slurm.following.follow import Follower
from tests.unit.slurm.test_slurm_render import spec


class ScriptedCommands:
    """SLURM's commands at the boundary: each argv's first word -> its answers in turn (rc,
    stdout), the last one kept."""

    where = "this machine"

    def __init__(self, **answers: list[tuple[int, str]]) -> None:
        self.answers, self.calls = answers, []

    def run(self, argv: list[str], **_: object) -> tuple[int, str, str]:
        self.calls.append(argv)
        turns = self.answers[argv[0]]
        rc, out = turns.pop(0) if len(turns) > 1 else turns[0]
        return rc, out, ""


def test_a_job_that_failed_in_the_queue_is_followed_to_its_end(tmp_path: Path) -> None:
    """Queued, then gone from squeue with sacct's FAILED and no node: the loop passes with no
    attempt, says each state once, and the run ends failed with the job's own word."""
    record = RunRecord.create(tmp_path, "q1")
    job = plan_slurm_job(
        spec("t.py"), SlurmOptions(nodes=2), "q1", None, job_dir=str(tmp_path / "nodes")
    )
    commands = ScriptedCommands(
        squeue=[(0, "PENDING|Priority|\n"), (0, "PENDING|Priority|\n"), (0, "")],
        scontrol=[(1, "")],
        sacct=[(0, "FAILED|1:0|\n")],
    )
    follower = Follower(job, record, commands, 41, {"run_id": "q1"}, None, False, footer=False)  # type: ignore[arg-type]
    code = follower.run()
    assert code == 1
    said = (record.logs_dir / "combined.log").read_text()
    assert said.count("SLURM job 41: PENDING (Priority)") == 1
    assert "SLURM job 41: FAILED" in said
    status = json.loads(record.status_path.read_text())
    assert status["state"] == "failed" and status["slurm_state"] == "FAILED"
    assert follower.sup is None  # no attempt ever ran
    assert [argv[0] for argv in commands.calls].count("squeue") == 3
