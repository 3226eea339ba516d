"""`--backend slurm --min-nodes K`, without a cluster: after a job's node failure, what comes
next (a spare, the nodes left, or the run's end at the floor), the next job's shape, the
console's lines, the attempts and the final outcome. The end-to-end test on the lab's SLURM
is tests/cluster/test_slurm_min_nodes_cluster.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.attempts.next_attempt import Next
from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.hosts.selection import hold_spares
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.record.states import RunState
from orchestrator.slurm.batch.job import SlurmJob
from orchestrator.slurm.batch.planning import plan_slurm_job
from orchestrator.slurm.control.parse import JobInfo
from orchestrator.slurm.recovery.job_attempts import JobAttempts, describe_job_attempt
from orchestrator.slurm.recovery.shrink import shrunk
from orchestrator.slurm.recovery.spares import SlurmSpares
from orchestrator.supervise import Outcome
from tests.unit.slurm.test_slurm_render import run_cli, spec
from tests.unit.slurm.test_slurm_spares import FakeCommands


def _job(nodes: int = 3, min_nodes: int = 2, **options: object) -> SlurmJob:
    return plan_slurm_job(
        spec("t.py", nproc_per_node=2),
        SlurmOptions(nodes=nodes, **options),  # type: ignore[arg-type]
        "r",
        None,
        job_dir="/r/nodes",
        output="/r/slurm-%j.out",
        min_nodes=min_nodes,
    )


def test_the_job_asks_slurm_not_to_requeue_it_and_says_what_happens() -> None:
    job = _job()
    assert "--no-requeue" in job.sbatch_lines  # a node failure ends it: NODE_FAIL
    assert job.to_dict()["min_nodes"].startswith(
        "2: after a node failure (NODE_FAIL), the job is submitted again on the nodes left"
    )
    assert (job.min_nodes, job.launched_nodes) == (2, 3)


def test_the_next_job_runs_on_the_nodes_left_with_the_same_environment() -> None:
    job = _job()
    new = shrunk(job, ["c2"], "/r/nodes-2")
    assert (new.nnodes, new.world_size, new.launched_nodes) == (2, 4, 3)
    assert "--nodes=2" in new.sbatch_lines and "--nodes=3" not in new.sbatch_lines
    lines = list(new.sbatch_lines)
    assert lines.index("--exclude=c2") == lines.index("--output=/r/slurm-%j.out") - 1
    assert "--no-requeue" in lines and new.job_dir == "/r/nodes-2"
    # The environment is the launch's: ORCHESTRATOR_LAUNCH_WORLD_SIZE still names the world
    # of 3 nodes x 2 ranks, so the trainer keeps its global batch.
    assert new.env == job.env and dict(new.env)["ORCHESTRATOR_LAUNCH_WORLD_SIZE"] == "6"
    again = shrunk(new, ["c1", "c1"], None)
    assert (again.nnodes, again.exclude) == (1, ("c2", "c1"))
    assert "--exclude=c2,c1" in again.sbatch_lines


def test_with_a_hostfile_the_node_list_loses_the_failed_nodes() -> None:
    cluster = parse_hostfile("n1\nn2\nn3\nn4\n", "hosts")
    job = plan_slurm_job(spec("t.py"), SlurmOptions(), "r", cluster, min_nodes=2)
    new = shrunk(job, ["n1", "n3"], None)
    assert (new.nnodes, new.nodelist) == (2, ("n2", "n4"))
    assert "--nodelist=n2,n4" in new.sbatch_lines and "--nodes=2" in new.sbatch_lines
    assert not any(line.startswith("--exclude") for line in new.sbatch_lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--min-nodes", "2", "--requeue"), "--min-nodes and --requeue"),
        (("--min-nodes", "4"), "--min-nodes 4 is more than the 3 node(s) the run starts on"),
    ],
)
def test_bad_min_nodes_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    code, _, err = run_cli(
        capsys, "render", "--backend", "slurm", "--nodes", "3", *args, "-o", str(tmp_path / "o"),
        "--", "t.py",
    )  # fmt: skip
    assert code == 2 and message in err and "Traceback" not in err, err


class Submitted:
    """The boundary where the next job would be handed to sbatch: what was submitted."""

    def __init__(self) -> None:
        self.jobs: list[tuple[SlurmJob, int]] = []

    def __call__(self, job: SlurmJob, number: int) -> int:
        self.jobs.append((job, number))
        return 100 + number


def test_a_lost_node_then_one_more_goes_on_with_fewer_then_reaches_the_floor() -> None:
    """A 3-node job, --min-nodes 2, no spare: c1 down (set DOWN by an administrator) -> the
    next job on 2 nodes; then c0 down -> 1 left, below the floor: the run ends lost, exit 1,
    naming the node and the floor."""
    job, submitted, notes = _job(), Submitted(), []
    commands = FakeCommands(sinfo=(0, "c0|allocated|none\nc1|down|test\nc2|allocated|none\n"))
    spares = SlurmSpares(job, commands, None, submitted)  # type: ignore[arg-type]
    attempts = JobAttempts(11, max_resubmits=10, nodes=job.nnodes)
    hosts = ["c0", "c1", "c2"]
    attempts.running(hosts, job.world_size)
    attempts.ended("NODE_FAIL", ranks_ok=False)
    failure = spares.failure(11, JobInfo(state="NODE_FAIL"), hosts)
    assert failure == ("c1", "SLURM job 11 ended NODE_FAIL: c1 is down: test")
    assert spares.after(job) is Next.SHRINK
    new = spares.replace(job, hosts, *failure, 2, notes.append)
    assert new is not None and new[1] == 102
    assert notes[0] == "c1 lost; no spare left; going on with 2 of 3 nodes (--min-nodes 2)"
    assert notes[1] == "run r: SLURM job 102 submitted (attempt 2) on 2 node(s), without c1"
    [(sent, number)] = submitted.jobs
    assert (sent.nnodes, sent.exclude, sent.job_dir, number) == (2, ("c1",), "/r/nodes-2", 2)
    assert spares.status()["min_nodes"] == 2 and spares.recoveries == []
    attempts.resubmitted(102, failure[1], sent.nnodes)
    attempts.running(["c0", "c2"], sent.world_size)
    spares.running(["c0", "c2"], notes.append)
    assert notes[2].startswith("running again on 2 node(s) (c0, c2), ")

    # One more lost: 1 of 3 left, fewer than --min-nodes 2.
    spares.commands = FakeCommands(sinfo=(0, "c0|down*|Not responding\nc2|allocated|none\n"))
    attempts.ended("NODE_FAIL", ranks_ok=False)
    failure = spares.failure(102, JobInfo(state="NODE_FAIL"), ["c0", "c2"])
    assert failure is not None and spares.after(sent) is Next.FLOOR
    assert spares.replace(sent, ["c0", "c2"], *failure, 3, notes.append) is None
    assert len(submitted.jobs) == 1  # nothing more submitted
    ended = Outcome(RunState.FAILED, 1, "job ended: SLURM job 102 ended NODE_FAIL")
    outcome = attempts.amend(spares.amend(ended))
    assert (outcome.state, outcome.exit_code) == (RunState.LOST, 1)
    assert (
        "c0 lost; no spare left; 1 of 3 nodes left, below --min-nodes 2: the floor was "
        "reached" in outcome.summary.splitlines()
    )
    assert re.fullmatch(
        r"on fewer nodes than the 3 launched with for \d+\.\d s \(down to 2; --min-nodes\)",
        outcome.summary.splitlines()[-1],
    ), outcome.summary
    world = attempts.status()["world"]
    assert [(w["attempt"], w["nodes"], w["ranks"], w["why"][:17]) for w in world] == [
        (1, ["c0", "c1", "c2"], 6, "launch"),
        (2, ["c0", "c2"], 4, "after job 11: SLU"),
    ]
    entries = attempts.status()["attempts"]
    assert [(s["job_id"], s["nodes"], s["ended"], s["next"]) for s in entries] == [
        (11, 3, "node-failure", "resubmitted as job 102 on 2 node(s)"),
        (102, 2, "node-failure", None),
    ]
    assert describe_job_attempt(entries[1]).startswith("2. job 102 on 2 node(s) ran ")


def test_spares_come_first_then_the_nodes_left() -> None:
    cluster = parse_hostfile("n1\nn2\nn3\nn4\n", "hosts")
    held = hold_spares(cluster, 1)
    job = plan_slurm_job(spec("t.py"), SlurmOptions(), "r", held, spares=1, min_nodes=2)
    submitted, notes = Submitted(), []
    commands = FakeCommands(sinfo=(0, "n2|down|test\n"))
    spares = SlurmSpares(job, commands, None, submitted)  # type: ignore[arg-type]
    failure = spares.failure(5, JobInfo(state="NODE_FAIL"), ["n1", "n2", "n3"])
    assert failure is not None and spares.after(job) is Next.SPARE
    replaced, _ = spares.replace(job, ["n1", "n2", "n3"], *failure, 2, notes.append) or (None, 0)
    assert replaced is not None and replaced.nodelist == ("n1", "n4", "n3")
    spares.commands = FakeCommands(sinfo=(0, "n3|down|test\n"))
    failure = spares.failure(102, JobInfo(state="NODE_FAIL"), ["n1", "n4", "n3"])
    assert failure is not None and spares.after(replaced) is Next.SHRINK
    smaller, _ = spares.replace(replaced, ["n1", "n4", "n3"], *failure, 3, notes.append) or (
        None,
        0,
    )
    assert smaller is not None and smaller.nodelist == ("n1", "n4")
    assert notes[-2] == "n3 lost; no spare left; going on with 2 of 3 nodes (--min-nodes 2)"


def test_a_job_that_failed_by_itself_is_not_a_reason_to_shrink() -> None:
    """Every node up (a rank's exit 3): no failure, so nothing is submitted again."""
    job, submitted = _job(), Submitted()
    commands = FakeCommands(sinfo=(0, "c0|idle|none\nc1|idle|none\nc2|idle|none\n"))
    spares = SlurmSpares(job, commands, None, submitted)  # type: ignore[arg-type]
    assert spares.failure(3, JobInfo(state="FAILED"), ["c0", "c1", "c2"]) is None
    assert spares.failure(3, JobInfo(state="COMPLETED"), ["c0", "c1", "c2"]) is None
    assert submitted.jobs == []


def test_render_states_the_rule_in_the_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys, "render", "--backend", "slurm", "--nodes", "3", "--min-nodes", "2", "-o",
        str(tmp_path / "o"), "--", "t.py",
    )  # fmt: skip
    assert code == 0, err
    script = (tmp_path / "o" / "job.sbatch").read_text()
    assert "# Fewer nodes: --min-nodes 2. After a node failure (NODE_FAIL), " in script
    assert "#SBATCH --no-requeue\n" in script
    assert "export ORCHESTRATOR_LAUNCH_WORLD_SIZE=3\n" in script
