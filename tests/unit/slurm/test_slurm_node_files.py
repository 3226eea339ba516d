"""Where a SLURM run's nodes keep their files when the run record is not shared with them
(orchestrator.slurm.batch.node_files, --job-dir): one way to make the job so, the script reaching
sbatch on stdin (here and on a login node, whose shell is run for real), and what the
launcher says instead of reading the nodes' files."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.backends.sessions import CHANNEL_CLOSED, Event
from orchestrator.cli import main
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.options.supervision import Supervision
from orchestrator.plan.spec import JobSpec, Program
from orchestrator.record.runs import RunRecord
from orchestrator.slurm.batch.node_files import batch_output, in_record, on_the_nodes
from orchestrator.slurm.control.client import SlurmCommands, remote_command, submit
from orchestrator.slurm.control.parse import JobInfo
from orchestrator.slurm.following.handover import Bookmarks
from orchestrator.slurm.following.node_agents import NodeAgents
from orchestrator.slurm.recovery.outcome import job_outcome
from orchestrator.slurm.submit import prepare_slurm
from tests.factories import FakeSession, hear_agents, supervisor

RECORD = Path("/home/alice/runs/r1")
ARGV = ("orchestrator", "launch", "--backend", "slurm")


def spec() -> JobSpec:
    return JobSpec(
        program=Program.from_argv(("train.py",)),
        python="/opt/venv/bin/python",
        workdir="/home/alice/project",
    )


def test_job_dir_and_logins_fallback_make_the_same_job() -> None:
    """--job-dir at planning and --login's switch after submission (on_the_nodes on the
    job planned for the record) are one function: the same job, the same script."""
    shared, _ = prepare_slurm(None, spec(), SlurmOptions(nodes=2), "r1", ARGV, RECORD)
    assert (shared.job_dir, shared.output) == in_record(RECORD) and not shared.node_side
    given, script = prepare_slurm(
        None, spec(), SlurmOptions(nodes=2, job_dir="/tmp/"), "r1", ARGV, RECORD
    )
    assert on_the_nodes(shared, "/tmp") == given
    assert given.job_dir == "/tmp/orchestrator-r1" and given.output == "/tmp/slurm-%j.out"
    assert batch_output(given, 42) == "/tmp/slurm-42.out"
    assert str(RECORD) not in script.split("orchestrator_node() {")[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (("render", "-o", "out", "--job-dir", "/tmp"), "No such option '--job-dir'"),
        (("launch", "--job-dir", "tmp"), "expected an absolute folder on the nodes"),
        (("launch", "--job-dir", "/a b"), "expected an absolute folder on the nodes"),
    ],
)
def test_job_dir_mistakes_are_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple, message: str
) -> None:
    os.chdir(tmp_path)
    (tmp_path / "t.py").write_text("print('hi')\n")
    with pytest.raises(SystemExit) as exited:
        main([argv[0], "--backend", "slurm", "--nodes", "1", *argv[1:], "--", "t.py"])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_job_dir_over_ssh_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n")
    with pytest.raises(SystemExit) as exited:
        main(["launch", str(hosts), "--job-dir", "/tmp", "--", "t.py"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--job-dir applies to --backend slurm only" in err


def fake_sbatch(tmp_path: Path) -> Path:
    """An sbatch that saves its stdin, its arguments and one setting, and says job 77."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(
        "#!/bin/sh\n"
        f"cat >{tmp_path}/script.got\n"
        f'printf "%s\\n" "$*" >{tmp_path}/args.got\n'
        f'printf "%s" "$HF_TOKEN" >{tmp_path}/token.got\n'
        "echo 77\n"
    )
    sbatch.chmod(0o755)
    return bin_dir


def test_the_script_reaches_sbatch_on_stdin_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{fake_sbatch(tmp_path)}:{os.environ['PATH']}")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2\necho hi\n")
    assert submit(SlurmCommands(), str(script), {"HF_TOKEN": "s3cr3t"}, on_stdin=True) == 77
    assert (tmp_path / "script.got").read_text() == script.read_text()
    assert (tmp_path / "args.got").read_text() == "--parsable\n"
    assert (tmp_path / "token.got").read_text() == "s3cr3t"


def test_a_login_nodes_shell_takes_the_settings_then_gives_sbatch_the_script(
    tmp_path: Path,
) -> None:
    """What a login node runs (remote_command), run by a real sh: every setting, however
    quoted, in sbatch's environment and never on its command line; the script, whole, on
    its stdin."""
    bin_dir = fake_sbatch(tmp_path)
    script = b"#!/bin/bash\n#SBATCH --nodes=2\necho 'it''s' \"$x\"\n\n\nend\n"
    secret = "a b'c\"$d\n=e=="
    command, stdin = remote_command(["sbatch", "--parsable"], {"HF_TOKEN": secret}, script)
    assert secret not in command
    done = subprocess.run(
        ["sh", "-c", command],
        input=stdin,
        capture_output=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"77\n"
    assert (tmp_path / "script.got").read_bytes() == script
    assert (tmp_path / "token.got").read_text() == secret
    # Without a script the settings are sourced as before (sbatch PATH, squeue, ...).
    assert remote_command(["squeue"], {}, None) == ("squeue", b"")


def test_an_unreached_nodes_lines_are_said_to_stay_on_it(tmp_path: Path) -> None:
    import queue

    events: queue.Queue = queue.Queue()
    record = RunRecord.create(tmp_path, "r1")
    agents = NodeAgents(7, 0, "python3", Bookmarks(record, None), events)
    agents.kept_on_node = "/tmp/orchestrator-r1/attempt0"

    class Channel:
        connected = False  # the dial never reached the keeper

    agents.sessions.append(FakeSession(0, Channel()))  # type: ignore[arg-type]
    supervision = Supervision(hang_timeout=0)
    sup = supervisor(
        tmp_path / "logs",
        ("n0",),
        1,
        sessions=agents.sessions,
        events=events,
        label="{host} r{rank}",
        supervision=supervision,
    )
    sink = sup.sink

    class Judge:
        def channel_closed(self, node: int) -> None:
            pass

    events.put(Event(0, CHANNEL_CLOSED, (), b"no node agent at ...\n", time.time()))
    hear_agents(agents, sup, Judge(), running=True)  # type: ignore[arg-type]
    sink.flush()
    said = (tmp_path / "logs" / "combined.log").read_text()
    assert agents.unreached == {0} and said.count("no way to its agent") == 1
    assert "stay on the node, in /tmp/orchestrator-r1/attempt0/node0" in said


def test_a_job_failing_before_its_nodes_names_the_batch_output_on_the_node(
    tmp_path: Path,
) -> None:
    here = tmp_path / "slurm-7.out"
    here.write_text("not this one\n")  # a file of that name here is not the node's
    outcome = job_outcome(7, JobInfo("FAILED", exit_code=2), None, None, here, "/tmp/slurm-7.out")
    assert outcome.summary.splitlines()[1:] == [
        "the batch script's output is on the batch node: /tmp/slurm-7.out"
    ]


def test_a_later_job_of_the_run_goes_to_sbatch_on_stdin_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a time limit or a node failure the run's next job (job-N.sbatch) is submitted
    the same way as its first: on stdin where the record is not shared."""
    from orchestrator.slurm.submit import resubmitter

    monkeypatch.setenv("PATH", f"{fake_sbatch(tmp_path)}:{os.environ['PATH']}")
    record = RunRecord.create(tmp_path, "r1")
    job, _ = prepare_slurm(
        None, spec(), SlurmOptions(nodes=2, job_dir="/scratch"), "r1", ARGV, record.path
    )
    resubmit = resubmitter(record, SlurmCommands(), "orchestrator launch ...", {})
    assert resubmit(job, 2) == 77
    assert (tmp_path / "args.got").read_text() == "--parsable\n"
    script = (tmp_path / "script.got").read_text()
    assert script == (record.path / "job-2.sbatch").read_text()
    assert "#SBATCH --output=/scratch/slurm-%j.out" in script


def test_a_dry_run_shows_the_script_going_to_sbatch_on_stdin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.py").write_text("print('hi')\n")
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as exited:
        main(
            ["launch", "--backend", "slurm", "--nodes", "2", "--job-dir", "/scratch"]
            + ["--dry-run", "--workdir", str(tmp_path), "--run-dir", str(runs)]
            + ["--run-id", "dry", "--", "t.py"]
        )
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert f"sbatch --parsable < {runs / 'dry' / 'job.sbatch'}" in out
    assert "#SBATCH --output=/scratch/slurm-%j.out" in out
    assert "export ORCHESTRATOR_JOB_DIR=/scratch/orchestrator-dry" in out
    assert not runs.exists()


def test_a_job_that_could_not_write_into_the_run_folder_points_to_job_dir(
    tmp_path: Path,
) -> None:
    """Neither --job-dir nor --login said the record is not shared: SLURM cannot open the
    batch output in a folder its batch node does not have, and fails the job at once
    (JobLaunchFailure); the launcher says what to do."""
    missing = tmp_path / "slurm-7.out"
    info = JobInfo("FAILED", reason="JobLaunchFailure", exit_code=181)
    summary = job_outcome(7, info, None, None, missing).summary.splitlines()
    assert summary[1] == (
        "SLURM wrote no slurm-7.out into the run folder: if --run-dir is not on a file "
        "system the nodes share, give --job-dir DIR (a folder on the nodes)"
    )


def test_pyxis_gets_each_nodes_folder_made_before_it_mounts_it() -> None:
    from orchestrator.plan.container import ContainerSpec

    container = ContainerSpec(image="nvcr.io#nvidia/pytorch:24.01-py3", runtime="pyxis")
    job_spec = JobSpec(
        program=Program.from_argv(("train.py",)),
        python="/usr/bin/python",
        workdir="/home/alice/project",
        container=container,
    )
    options = SlurmOptions(nodes=2, job_dir="/scratch")
    job, script = prepare_slurm(None, job_spec, options, "r1", ARGV, RECORD)
    made = 'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 mkdir -p "$ORCHESTRATOR_JOB_DIR"'
    checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    assert made in script
    assert script.index(made) < script.index("srun --kill-on-bad-exit=1")
    assert "--container-mounts=" in script and "/scratch/orchestrator-r1:" in script
    shared, script = prepare_slurm(None, job_spec, SlurmOptions(nodes=2), "r1", ARGV, RECORD)
    assert made not in script  # the record is there on every node already
