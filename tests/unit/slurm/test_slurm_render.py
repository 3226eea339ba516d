"""The sbatch script: golden files (tests/golden/slurm/), bash -n, and bad input.

Regenerate the golden files after an intended template change with
UPDATE_GOLDEN=1 pytest tests/unit/slurm/test_slurm_render.py, and review the diff.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.hosts.selection import select_hosts
from orchestrator.options.choosing import Selection
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.plan.container import ContainerSpec, parse_mounts
from orchestrator.plan.scripts import render_template
from orchestrator.plan.spec import JobSpec, Program
from orchestrator.slurm.batch.batch_script import render_sbatch
from orchestrator.slurm.batch.planning import plan_slurm_job
from orchestrator.slurm.submit import prepare_slurm

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "slurm"
ARGV = ("orchestrator", "render", "--backend", "slurm", "-o", "out")


def spec(*program: str, **kwargs: object) -> JobSpec:
    values: dict = {"python": "/opt/venv/bin/python", "workdir": "/home/alice/project"}
    return JobSpec(program=Program.from_argv(program), **{**values, **kwargs})


def without_agent_code(script: str) -> str:
    """The script with the node agent's code (gzipped base64, tested on its own) as one line."""
    return re.sub(
        r"(export ORCHESTRATOR_AGENT_CODE=')\n[A-Za-z0-9+/=\n]+\n'",
        "\\1\n<the node agent's code>\n'",
        script,
    )


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    done = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
    text = without_agent_code(text)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden file (see module doc)"


def test_golden_minimal_two_nodes_by_hand() -> None:
    """`render --backend slurm --nodes 2 --partition debug -- train.py`: ranks write to
    slurm-<jobid>.out, no per-rank files."""
    _, script = prepare_slurm(
        None,
        spec("train.py", "--lr", "0.1"),
        SlurmOptions(nodes=2, partition="debug"),
        "run-min",
        ARGV,
    )
    check_golden("minimal.sbatch", script)
    assert "ORCHESTRATOR_JOB_DIR" not in script.split("orchestrator_node() {")[0]
    assert "--output" not in script


def test_golden_everything_from_a_hostfile_under_launch(tmp_path: Path) -> None:
    cluster = parse_hostfile("gpu-a slots=4 ifname=ib0\ngpu-b slots=4 ifname=ib0\n", "hosts.txt")
    options = SlurmOptions(
        partition="gpu",
        time="02:00:00",
        account="proj-7",
        job_name="bert",
        gpus_per_node=4,
        cpus_per_node=32,
        signal="USR1@120",
        requeue=True,
        sbatch_args=("--mem=64G", "--exclusive"),
    )
    job, script = prepare_slurm(
        cluster,
        spec(
            "-m",
            "orchestrator.trainer",
            "--checkpoint-dir",
            "ckpt",
            "--resume",
            env=(("WANDB_MODE", "offline"), ("HF_TOKEN", "s3cr3t")),
            master_port=29600,
        ),
        options,
        "run-all",
        ARGV,
        Path("/home/alice/runs/run-all"),
    )
    check_golden("full.sbatch", script)
    assert "s3cr3t" not in script and ': "${HF_TOKEN:?' in script
    assert job.nproc == 4 and job.nodelist == ("gpu-a", "gpu-b")


def test_golden_bundled_trainer_with_default_ranks() -> None:
    _, script = prepare_slurm(
        None, spec(), SlurmOptions(nodes=3), "run-trainer", ARGV, Path("/scratch/runs/run-trainer")
    )
    check_golden("trainer.sbatch", script)


def test_golden_selection_and_bind_cores() -> None:
    """--exclude drops a host and a slot: the node list and each node's CUDA_VISIBLE_DEVICES
    (by SLURMD_NODENAME, as SLURM orders nodes its own way); --bind-cores on each node."""
    cluster = parse_hostfile("gpu-a slots=4\ngpu-b slots=4\ngpu-c slots=3\n", "hosts.txt")
    cluster = select_hosts(cluster, Selection(exclude="gpu-a:3@gpu-b:1@gpu-c"))
    job, script = prepare_slurm(
        cluster, spec("train.py", bind_cores=True), SlurmOptions(), "run-sel", ARGV
    )
    check_golden("selected.sbatch", script)
    assert job.nodelist == ("gpu-a", "gpu-b") and job.nproc == 3
    assert job.visible_devices == (("gpu-a", "0,1,2"), ("gpu-b", "0,2,3"))
    assert job.to_dict()["selection"] == "--exclude gpu-a:3@gpu-b:1@gpu-c"


def test_golden_pyxis_container() -> None:
    """`--container nvcr.io#... --container-mounts /data:/data:ro --container-workdir
    /workspace` under launch: srun's --container-* flags, the image's python3."""
    container = ContainerSpec(
        image="nvcr.io#nvidia/pytorch:24.05-py3",
        mounts=parse_mounts("/data:/data:ro"),
        workdir="/workspace",
    )
    argv = ("orchestrator", "launch", "--backend", "slurm", "--nodes", "2", "--gpus-per-node", "8")
    argv += ("--container", container.image, "--container-mounts", "/data:/data:ro")
    argv += ("--container-workdir", "/workspace", "--", "train.py")
    job, script = prepare_slurm(
        None,
        spec("train.py", container=container),
        SlurmOptions(nodes=2, gpus_per_node=8),
        "run-pyxis",
        argv,
        Path("/scratch/runs/run-pyxis"),
    )
    check_golden("pyxis.sbatch", script)
    assert job.python == "python3" and "/opt/venv/bin/python" not in script


def test_golden_apptainer_container() -> None:
    """`--container /images/pytorch.sif --container-runtime apptainer`, rendered to submit
    by hand: each node's task runs `apptainer exec`, --bind for every mount."""
    container = ContainerSpec(
        image="/images/pytorch.sif",
        runtime="apptainer",
        mounts=parse_mounts("/datasets/imagenet:/data"),
        python="/opt/conda/bin/python",
    )
    argv = (*ARGV, "--nodes", "2", "--container", container.image)
    argv += ("--container-runtime", "apptainer", "--container-mounts", "/datasets/imagenet:/data")
    argv += ("--container-python", "/opt/conda/bin/python", "--", "train.py")
    job, script = prepare_slurm(
        None, spec("train.py", container=container), SlurmOptions(nodes=2), "run-apptainer", argv
    )
    check_golden("apptainer.sbatch", script)
    assert job.python == "/opt/conda/bin/python" and "/opt/venv/bin/python" not in script


def test_golden_files_on_the_nodes_in_an_apptainer_image() -> None:
    """`launch ... --job-dir /scratch/local --container IMAGE --container-runtime apptainer`:
    the nodes' files and the batch output in that folder on the nodes, never in the run
    record (which the nodes do not see); each node makes its folder before the image
    mounts it."""
    container = ContainerSpec(image="/images/pytorch.sif", runtime="apptainer")
    job, script = prepare_slurm(
        None,
        spec("train.py", container=container),
        SlurmOptions(nodes=2, job_dir="/scratch/local"),
        "run-local",
        ARGV,
        Path("/home/alice/laptop/runs/run-local"),
    )
    check_golden("node_side.sbatch", script)
    assert job.node_side and "/home/alice/laptop" not in script
    assert "#SBATCH --output=/scratch/local/slurm-%j.out" in script
    assert "export ORCHESTRATOR_JOB_DIR=/scratch/local/orchestrator-run-local" in script
    assert "/scratch/local/orchestrator-run-local:/scratch/local/orchestrator-run-local" in script
    apptainer = script.split("orchestrator_apptainer() {")[1].split("\n}")[0]
    assert 'mkdir -p "$ORCHESTRATOR_JOB_DIR"' in apptainer


def test_selection_with_uneven_slots_is_refused() -> None:
    cluster = parse_hostfile("gpu-a slots=4\ngpu-b slots=4\n", "hosts.txt")
    cluster = select_hosts(cluster, Selection(include="gpu-a@gpu-b:0,2"))
    with pytest.raises(
        ConfigError,
        match=r"^--include gpu-a@gpu-b:0,2: leaves 2 slot\(s\) "
        r"on gpu-b but 4 on gpu-a",
    ):
        plan_slurm_job(spec("t.py"), SlurmOptions(), "r1", cluster)


def test_golden_restarts_use_c10d_in_node_order() -> None:
    """`--max-restarts 3`: torchrun's c10d rendezvous on node 0, ranks in SLURM_NODEID order."""
    job, script = prepare_slurm(
        None, spec("train.py", max_restarts=3), SlurmOptions(nodes=2), "run-restarts", ARGV
    )
    check_golden("restarts.sbatch", script)
    assert job.max_restarts == 3 and "--max-restarts=3" in script
    assert '--rdzv-id="$SLURM_JOB_ID"' in script and "--node_rank" not in script


def test_launch_with_restarts_dry_run_shows_the_c10d_script(tmp_path: Path) -> None:
    """Followed like any job (a failing rank is a restart until torchrun gives up)."""
    import io

    from orchestrator.options.running import RunOptions
    from orchestrator.slurm.submit import launch_slurm
    from orchestrator.start.settings import LaunchOptions, LaunchRequest

    options = LaunchOptions(run_id="r", argv=ARGV, run=RunOptions(run_dir=str(tmp_path)))
    out = io.BytesIO()
    request = LaunchRequest(
        "slurm", None, spec("-m", "pkg", max_restarts=1), options, SlurmOptions(nodes=2)
    )
    assert launch_slurm(request, dry_run=True, out=out) == 0
    shown = out.getvalue().decode()
    assert "--max-restarts=1 \\\n        --rdzv-backend=c10d" in shown
    assert "max_restarts: '1  # torchrun --max-restarts, c10d rendezvous" in shown
    assert not any(tmp_path.iterdir())


def test_sbatch_lines_only_when_given_or_needed() -> None:
    job = plan_slurm_job(spec("t.py"), SlurmOptions(nodes=4), "r1")
    assert job.sbatch_lines == ("--job-name=r1", "--nodes=4", "--ntasks-per-node=1")
    launched = plan_slurm_job(
        spec("t.py"),
        SlurmOptions(nodes=1, requeue=True),
        "r2",
        job_dir="/r/r2/nodes",
        output="/r/r2/slurm-%j.out",
    )
    assert launched.sbatch_lines[-3:] == (
        "--output=/r/r2/slurm-%j.out",
        "--requeue",
        "--open-mode=append",
    )


def test_a_time_limit_brings_the_warning_and_resubmission() -> None:
    """--time alone (or as an --sbatch-arg): SIGUSR1 ahead of it, and `launch` resubmits."""
    job = plan_slurm_job(spec("t.py"), SlurmOptions(nodes=2, time="1"), "r", job_dir="/r/nodes")
    assert "--time=1" in job.sbatch_lines and "--signal=B:USR1@15" in job.sbatch_lines
    assert job.max_resubmits == 10 and job.signal_name == "USR1"
    script = render_sbatch(job, "orchestrator launch ...")
    assert (
        "# Time limit: time limit 60 s; SIGUSR1 to every rank 15 s before; once they stopped "
        "on it `orchestrator launch` submits it again, up to 10 time(s)." in script
    )
    assert 'printf \'%s %s\\n\' USR1 "$EPOCHREALTIME" >"$dir/warning"' in script
    by_arg = plan_slurm_job(
        spec("t.py"), SlurmOptions(nodes=1, sbatch_args=("--time=4:00:00",), max_resubmits=2), "r"
    )
    assert "--signal=B:USR1@120" in by_arg.sbatch_lines and by_arg.max_resubmits == 2
    assert not any(line.startswith("--time=4") for line in by_arg.sbatch_lines[:-1])
    by_hand = render_sbatch(plan_slurm_job(spec("t.py"), SlurmOptions(nodes=1, time="1"), "r"), "x")
    assert "once they stopped on it submit it again to resume (or render with --requeue)" in by_hand
    quiet = plan_slurm_job(spec("t.py"), SlurmOptions(nodes=1, time="1", signal="none"), "r")
    assert not any(line.startswith("--signal") for line in quiet.sbatch_lines)
    assert "# Time limit" not in render_sbatch(quiet, "x")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (SlurmOptions(nodes=1, time="1", signal="USR1@60"), "the warning would come before"),
        (SlurmOptions(nodes=1, requeue=True, max_resubmits=3), "--requeue and --max-resubmits"),
        (SlurmOptions(nodes=1, sbatch_args=("--time=soon",)), "--time 'soon'"),
    ],
)
def test_time_limit_mistakes_are_bad_input(options: SlurmOptions, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan_slurm_job(spec("t.py"), options, "r")


def test_run_rank_has_one_source_for_both_templates() -> None:
    run_rank = render_template("_run_rank.sh.j2")
    _, script = prepare_slurm(None, spec("t.py"), SlurmOptions(nodes=1), "r", ARGV)
    assert run_rank in script
    node_template = (Path(__file__).resolve().parents[3] / "templates" / "node.sh.j2").read_text()
    assert '{% include "_run_rank.sh.j2" %}' in node_template
    assert "run_rank() {" not in node_template


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({}, "needs --nodes N"),
        ({"nodes": 0}, "--nodes must be a positive integer, got 0 (keyword nodes)"),
        ({"nodes": 1, "time": "an hour"}, "--time 'an hour'"),
        ({"nodes": 1, "partition": "a b"}, "--partition 'a b'"),
        ({"nodes": 1, "job_name": "my job"}, "--job-name 'my job'"),
        ({"nodes": 1, "sbatch_args": ("mem=4G",)}, "--sbatch-arg 'mem=4G'"),
        ({"nodes": 1, "sbatch_args": ("--comment=a\nb",)}, "one sbatch option on one line"),
        ({"nodes": 1, "gpus_per_node": 0}, "--gpus-per-node must be a positive integer, got 0"),
    ],
)
def test_bad_options_name_the_flag(keywords: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_slurm_job(spec("t.py"), SlurmOptions(**keywords), "r")


def test_hostfile_must_agree_with_nodes_and_be_uniform() -> None:
    cluster = parse_hostfile("a slots=2\nb slots=4\n", "hosts.txt")
    with pytest.raises(ConfigError, match=r"hosts.txt:2: slots=4 differs .* --nproc-per-node"):
        plan_slurm_job(spec("t.py"), SlurmOptions(), "r", cluster)
    assert plan_slurm_job(spec("t.py", nproc_per_node=2), SlurmOptions(), "r", cluster).nproc == 2
    with pytest.raises(ConfigError, match="--nodes 3 but hosts.txt lists 2 host"):
        plan_slurm_job(spec("t.py", nproc_per_node=2), SlurmOptions(nodes=3), "r", cluster)


def test_sync_does_not_apply() -> None:
    with pytest.raises(ConfigError, match="--sync does not apply to --backend slurm"):
        plan_slurm_job(spec("t.py", sync_dir="/src"), SlurmOptions(nodes=1), "r")


def test_given_flags_name_the_options() -> None:
    options = SlurmOptions(partition="p", sbatch_args=("--mem=1G",), requeue=True)
    assert options.given() == ["--partition", "--sbatch-arg", "--requeue"]


# --- through the command line ----------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exited.value.code), out, err


def test_render_without_hostfile_takes_the_program_after_dashes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    code, out, _ = run_cli(
        capsys,
        "render",
        "--backend",
        "slurm",
        "--nodes",
        "2",
        "--partition",
        "debug",
        "-o",
        str(out_dir),
        "--run-id",
        "r1",
        "--",
        "train.py",
        "--epochs",
        "3",
    )
    assert code == 0 and out.split() == [str(out_dir / "plan.yaml"), str(out_dir / "job.sbatch")]
    script = (out_dir / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --partition=debug\n" in script
    assert "-u train.py --epochs 3 || rc=$?" in script
    assert os.access(out_dir / "job.sbatch", os.X_OK)


def test_render_with_hostfile_lists_the_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("n1 slots=2\nn2 slots=2\n")
    code, _, _ = run_cli(
        capsys,
        "render",
        "--backend",
        "slurm",
        str(hosts),
        "-o",
        str(tmp_path / "o"),
        "--",
        "train.py",
    )
    script = (tmp_path / "o" / "job.sbatch").read_text()
    assert code == 0 and "#SBATCH --nodelist=n1,n2\n" in script and "--nproc_per_node=2" in script


def test_slurm_flags_without_slurm_backend_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n")
    code, _, err = run_cli(capsys, "launch", str(hosts), "--partition", "gpu", "--", "t.py")
    assert code == 2 and "--partition applies to --backend slurm only" in err
    code, _, err = run_cli(capsys, "launch", "--", "t.py")
    assert code == 2 and "HOSTFILE is missing" in err
    code, _, err = run_cli(
        capsys, "render", "--backend", "slurm", "-o", str(tmp_path), "--", "t.py"
    )
    assert code == 2 and "needs --nodes N" in err


def test_launch_dry_run_prints_the_script_and_submits_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.py").write_text("print('hi')\n")
    code, out, _ = run_cli(
        capsys,
        "launch",
        "--backend",
        "slurm",
        "--nodes",
        "2",
        "--dry-run",
        "--workdir",
        str(tmp_path),
        "--run-dir",
        str(tmp_path / "runs"),
        "--run-id",
        "dry",
        "--",
        "t.py",
    )
    assert code == 0 and "#SBATCH --nodes=2" in out
    assert f"sbatch --parsable {tmp_path / 'runs' / 'dry' / 'job.sbatch'}" in out
    assert not (tmp_path / "runs").exists()


def test_launch_of_a_missing_script_is_refused_before_submitting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys,
        "launch",
        "--backend",
        "slurm",
        "--nodes",
        "1",
        "--workdir",
        str(tmp_path),
        "--run-dir",
        str(tmp_path / "runs"),
        "--",
        "nope.py",
    )
    assert code == 2 and "script 'nope.py' not found" in err
