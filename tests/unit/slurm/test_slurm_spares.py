"""`--backend slurm --spares N`, without a cluster: the script (golden file), the job that
replaces one with a failed node, the nodes SLURM reports failed, and bad input.
The end-to-end test on the lab's SLURM is tests/cluster/test_slurm_spares_cluster.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.hosts.selection import hold_spares
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.slurm.batch.planning import plan_slurm_job
from orchestrator.slurm.recovery.spares import check_capacity, failed_nodes, resubmitted
from orchestrator.slurm.submit import prepare_slurm
from tests.unit.slurm.test_slurm_render import ARGV, check_golden, run_cli, spec


class FakeCommands:
    """SLURM's commands at the boundary: each argv's first word -> (rc, stdout)."""

    def __init__(self, **answers: tuple[int, str]) -> None:
        self.answers, self.calls = answers, []

    def run(self, argv: list[str], **_: object) -> tuple[int, str, str]:
        self.calls.append(argv)
        rc, out = self.answers[argv[0]]
        return rc, out, ""


def test_golden_spares_from_a_hostfile(tmp_path: Path) -> None:
    cluster = hold_spares(parse_hostfile("n1 slots=2\nn2 slots=2\nn3 slots=2\n", "hosts"), 1)
    job, script = prepare_slurm(
        cluster, spec("train.py"), SlurmOptions(), "run-spares", ARGV, tmp_path, spares=1
    )
    check_golden("spares.sbatch", script.replace(str(tmp_path), "/runs/run-spares"))
    assert "#SBATCH --nodelist=n1,n2\n#SBATCH --output=" in script
    assert "#SBATCH --no-requeue\n" in script and "the next of n3 in its place" in script
    assert job.to_dict()["spares"].startswith("1: after a node failure")


def test_a_failed_node_is_replaced_by_the_next_spare_in_its_place() -> None:
    cluster = hold_spares(parse_hostfile("n1\nn2\nn3\nn4\nn5\n", "hosts"), 2)
    job = plan_slurm_job(spec("t.py"), SlurmOptions(), "r", cluster, job_dir="/r/nodes", spares=2)
    new = resubmitted(job, "n2", "/r/nodes-2")
    assert (new.nodelist, new.spare_nodes, new.spares) == (("n1", "n4", "n3"), ("n5",), 1)
    assert "--nodelist=n1,n4,n3" in new.sbatch_lines and new.job_dir == "/r/nodes-2"
    assert not any(line.startswith("--exclude") for line in new.sbatch_lines)


def test_without_a_hostfile_the_failed_nodes_go_into_exclude() -> None:
    options = SlurmOptions(nodes=2, partition="debug")
    job = plan_slurm_job(
        spec("t.py"), options, "r", None, output="/r/slurm-%j.out", spares=2, exclude=("old",)
    )
    assert "--exclude=old" in job.sbatch_lines
    new = resubmitted(resubmitted(job, "a", None), "b", None)
    assert new.spares == 0 and new.exclude == ("old", "a", "b")
    assert (
        new.sbatch_lines.index("--exclude=old,a,b")
        == new.sbatch_lines.index("--output=/r/slurm-%j.out") - 1
    )


def test_failed_nodes_are_those_down_or_not_responding() -> None:
    sinfo = "n1|mixed|none\nn2|down*|Not responding\nn3|idle*|none\nx|down|gone\n"
    commands = FakeCommands(sinfo=(0, sinfo))
    assert failed_nodes(commands, ["n1", "n2", "n3"]) == [  # type: ignore[arg-type]
        ("n2", "down*: Not responding"),
        ("n3", "idle*"),
    ]
    assert failed_nodes(FakeCommands(sinfo=(1, "")), ["n1"]) == []  # type: ignore[arg-type]


def test_more_spares_than_the_partition_holds_is_refused() -> None:
    job = plan_slurm_job(spec("t.py"), SlurmOptions(nodes=2), "r", None, spares=2, exclude=("c",))
    commands = FakeCommands(sinfo=(0, "a\nb\nc\nd\n"))
    with pytest.raises(ConfigError, match=r"--spares 2 with --nodes 2: .* has 3 usable"):
        check_capacity(commands, job, "debug")  # type: ignore[arg-type]
    assert commands.calls[0][-2:] == ["-p", "debug"]
    check_capacity(FakeCommands(sinfo=(0, "a\nb\nc\nd\ne\n")), job, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("HOSTS", "--spares", "2"), "--spares 2 leaves no host to run on"),
        (("--nodes", "2", "--spares", "1", "--requeue"), "--spares and --requeue"),
    ],
)
def test_bad_spares_are_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("n1\nn2\n")
    args = tuple(str(hosts) if a == "HOSTS" else a for a in args)
    code, _, err = run_cli(
        capsys, "render", "--backend", "slurm", *args, "-o", str(tmp_path / "o"), "--", "t.py"
    )
    assert code == 2 and message in err and "Traceback" not in err


def test_render_shows_the_spare_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run_cli(
        capsys,
        "render",
        "--backend",
        "slurm",
        "--nodes",
        "2",
        "--spares",
        "3",
        "-o",
        str(tmp_path / "o"),
        "--",
        "t.py",
    )
    script = (tmp_path / "o" / "job.sbatch").read_text()
    assert code == 0 and "# Spares: 3 (--spares)" in script and "up to 3 time(s)" in script
    assert "spares: '3: after a node failure" in (tmp_path / "o" / "plan.yaml").read_text()
