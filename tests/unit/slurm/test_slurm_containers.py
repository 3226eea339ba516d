"""--container under --backend slurm (orchestrator/slurm/batch/containers.py): pyxis's srun flags,
apptainer's command, the image's python in job.sbatch, and the script run end to end on
this machine with stand-ins for srun, apptainer and the image's python.

The golden renders are tests/golden/slurm/pyxis.sbatch and apptainer.sbatch
(tests/unit/slurm/test_slurm_render.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.plan.container import ContainerSpec, Mount, parse_mounts
from orchestrator.plan.spec import JobSpec, Program
from orchestrator.slurm.batch.containers import (
    apptainer_exec_args,
    container_mounts,
    slurm_container,
    srun_container_args,
)
from orchestrator.slurm.batch.planning import plan_slurm_job
from orchestrator.slurm.submit import prepare_slurm

ARGV = ("orchestrator", "render", "--backend", "slurm")
PYXIS = ContainerSpec(
    image="nvcr.io#nvidia/pytorch:24.05-py3", mounts=parse_mounts("/data:/data:ro")
)
APPTAINER = ContainerSpec(
    image="/images/pytorch.sif", runtime="apptainer", mounts=parse_mounts("/data:/data:ro")
)


def spec(container: ContainerSpec, **kwargs: object) -> JobSpec:
    values: dict = {"python": "/opt/venv/bin/python", "workdir": "/home/alice/project"}
    program = Program.from_argv(("train.py",))
    return JobSpec(program=program, container=container, **{**values, **kwargs})


def with_python(container: ContainerSpec, python: str) -> ContainerSpec:
    return ContainerSpec(
        image=container.image, runtime=container.runtime, mounts=container.mounts, python=python
    )


# --- pyxis -------------------------------------------------------------------------------


def test_pyxis_mounts_the_workdir_and_job_folder_then_the_users() -> None:
    container = ContainerSpec(
        image="nvcr.io#nvidia/pytorch:24.05-py3",
        mounts=parse_mounts("/data:/data:ro,/scratch/cache:/cache"),
        args=("--container-remap-root",),
    )
    assert srun_container_args(container, "/home/alice/project", "/runs/r1/nodes") == (
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        "--container-mounts=/home/alice/project:/home/alice/project,"
        "/runs/r1/nodes:/runs/r1/nodes,/data:/data:ro,/scratch/cache:/cache",
        "--container-workdir=/home/alice/project",
        "--container-remap-root",
    )


def test_pyxis_starts_in_the_container_workdir_and_without_a_job_folder_by_hand() -> None:
    container = ContainerSpec(image="nvcr.io#nvidia/pytorch:24.05-py3", workdir="/workspace")
    assert srun_container_args(container, "/home/alice/project", None) == (
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        "--container-mounts=/home/alice/project:/home/alice/project",
        "--container-workdir=/workspace",
    )


def test_pyxis_flags_reach_the_srun_line_quoted() -> None:
    _, script = prepare_slurm(None, spec(PYXIS), SlurmOptions(nodes=2), "r", ARGV, Path("/runs/r"))
    srun = script[script.index("\nsrun ") + 1 :].split(" &\n")[0]
    assert "'--container-image=nvcr.io#nvidia/pytorch:24.05-py3'" in srun
    assert (
        "--container-mounts=/home/alice/project:/home/alice/project,"
        "/runs/r/nodes:/runs/r/nodes,/data:/data:ro" in srun
    )
    assert srun.endswith("--container-workdir=/home/alice/project bash -c orchestrator_agent")
    assert 'mkdir -p "$ORCHESTRATOR_JOB_DIR"' in script  # mounted: it must exist first
    assert "apptainer" not in script


# --- apptainer ---------------------------------------------------------------------------


def test_apptainer_binds_every_mount_and_starts_in_the_workdir() -> None:
    container = ContainerSpec(
        image="/images/pytorch.sif",
        runtime="apptainer",
        mounts=parse_mounts("/data:/data:ro"),
        workdir="/workspace",
        args=("--writable-tmpfs",),
    )
    assert apptainer_exec_args(container, "/home/alice/project", "/runs/r1/nodes") == (
        "--bind",
        "/home/alice/project:/home/alice/project",
        "--bind",
        "/runs/r1/nodes:/runs/r1/nodes",
        "--bind",
        "/data:/data:ro",
        "--pwd",
        "/workspace",
        "--writable-tmpfs",
        "/images/pytorch.sif",
    )


def test_apptainer_keeps_the_environment_and_gets_the_gpus_where_there_are() -> None:
    _, script = prepare_slurm(None, spec(APPTAINER), SlurmOptions(nodes=2), "r", ARGV)
    function = script.split("orchestrator_apptainer() {\n")[1].split("\n}\n")[0]
    assert "--cleanenv" not in function
    assert function.startswith("    local -a argv=(apptainer exec)\n")
    assert "if [ -e /dev/nvidiactl ]; then argv+=(--nv); fi" in script
    assert (
        "argv+=(--bind /home/alice/project:/home/alice/project --bind /data:/data:ro "
        "--pwd /home/alice/project /images/pytorch.sif)" in script
    )
    assert "bash -c \"$(declare -fx)\"$'\\norchestrator_node'" in script
    assert (
        "--ntasks-per-node=1 bash -c orchestrator_agent &\n"
        'orchestrator_srun=$!\nrc=0\nwhile :; do\n    wait "$orchestrator_srun" && rc=0 || '
        'rc=$?\n    kill -0 "$orchestrator_srun" 2>/dev/null || break  # a trapped signal '
        "ended the wait early\ndone\n" in script
    )
    assert script.endswith('rm -f "$orchestrator_stopped"\nexit "$rc"\n')


@pytest.mark.parametrize(
    ("image", "runtime"),
    [("nvcr.io#nvidia/pytorch:24.05-py3", "pyxis"), ("/images/pytorch.sif", "apptainer")],
)
def test_auto_is_pyxis_or_apptainer_for_a_sif(image: str, runtime: str) -> None:
    chosen = slurm_container(ContainerSpec(image=image), "/w", None)
    assert chosen.spec.runtime == runtime
    job = plan_slurm_job(spec(ContainerSpec(image=image)), SlurmOptions(nodes=1), "r")
    assert job.to_dict()["container"] == {"image": image, "runtime": runtime, "python": "python3"}
    assert job.to_dict()["python"] == "python3"


# --- both --------------------------------------------------------------------------------


@pytest.mark.parametrize("container", [PYXIS, APPTAINER], ids=["pyxis", "apptainer"])
@pytest.mark.parametrize("max_restarts", [0, 2])
def test_torchrun_and_the_ranks_run_the_images_python(
    container: ContainerSpec, max_restarts: int
) -> None:
    image_python = with_python(container, "/opt/conda/bin/python")
    _, script = prepare_slurm(
        None,
        spec(image_python, bind_cores=True, max_restarts=max_restarts),
        SlurmOptions(nodes=2),
        "r",
        ARGV,
    )
    assert '    /opt/conda/bin/python "${torchrun[@]}" \\\n' in script
    assert "        /opt/conda/bin/python -u train.py || rc=$?\n" in script
    assert "$(orchestrator_cores /opt/conda/bin/python sets 1)" in script
    assert "/opt/venv/bin/python" not in script
    assert "# run inside the image, with its /opt/conda/bin/python;" in script


@pytest.mark.parametrize("container", [PYXIS, APPTAINER], ids=["pyxis", "apptainer"])
def test_no_secret_value_lands_in_the_script_or_the_plan(
    container: ContainerSpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--container", container.image, "--container-runtime", container.runtime]
    env = ["--env", "HF_TOKEN=s3cr3t", "--env", "WANDB_MODE=offline"]
    argv = [*RENDER_SLURM, "2", *flags, *env, "-o", str(tmp_path), "--", "train.py"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    script = (tmp_path / "job.sbatch").read_text()
    plan = (tmp_path / "plan.yaml").read_text()
    assert "s3cr3t" not in script and "s3cr3t" not in plan
    assert ': "${HF_TOKEN:?is a secret this job needs' in script
    assert "export WANDB_MODE=offline\n" in script
    assert yaml.safe_load(plan)["container"]["image"] == container.image


# --- refused -----------------------------------------------------------------------------


RENDER_SLURM = ("render", "--backend", "slurm", "--nodes")  # then the node count


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exited.value.code), out, err


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_ssh_runtimes_are_refused_under_slurm(
    runtime: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys,
        *RENDER_SLURM,
        "1",
        "--container",
        "pytorch/pytorch:latest",
        "--container-runtime",
        runtime,
        "-o",
        str(tmp_path / "out"),
        "--",
        "train.py",
    )
    assert code == 2
    assert f"--container-runtime {runtime} does not run under the slurm backend" in err
    assert "auto, pyxis, apptainer" in err
    assert not (tmp_path / "out").exists()


def test_a_home_relative_mount_source_is_refused() -> None:
    container = ContainerSpec(image="img", mounts=(Mount("~/data", "/data"),))
    with pytest.raises(ConfigError, match=r"'~/data:/data': under --backend slurm give the"):
        plan_slurm_job(spec(container), SlurmOptions(nodes=1), "r")


def test_a_folder_a_mount_cannot_name_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"'/home/alice/a,b': a container mount cannot"):
        container_mounts(PYXIS, "/home/alice/a,b", None)


# --- the script, run with stand-ins ------------------------------------------------------

# srun on one node: the task is the command after srun's own flags (pyxis's among them),
# with the job's environment, exported functions included (as srun and pyxis pass it).
FAKE_SRUN = """#!/bin/bash
while [[ $1 == -* ]]; do shift; done
export SLURM_NODEID=0 SLURMD_NODENAME=n1
exec "$@"
"""

# `apptainer exec`: only variables with valid names cross (no exported functions), the
# command after the image runs in --pwd.
FAKE_APPTAINER = """#!/bin/bash
shift
while [[ $1 == -* ]]; do
    case $1 in
        --nv) shift ;;
        --pwd) cd "$2"; shift 2 ;;
        *) shift 2 ;;
    esac
done
shift
crossing=()
for name in $(compgen -e); do crossing+=("$name=${!name}"); done
exec env -i "${crossing[@]}" "$@"
"""

# The image's python: as torchrun, start the rank's command once as rank 0; as the rank,
# write where it ran and its arguments.
FAKE_PYTHON = """#!/bin/bash
if [ "$1" = -I ]; then  # the node agent: run by this machine's interpreter
    exec python3 "$@"
fi
if [ "$1" = -m ]; then
    while [ "$1" != --no-python ]; do shift; done
    shift
    RANK=0 LOCAL_RANK=0 exec "$@"
fi
printf '%s %s\\n' "$PWD" "$*" >"$ORCHESTRATOR_JOB_DIR/ran"
"""


def stand_ins(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (
        ("srun", FAKE_SRUN),
        ("apptainer", FAKE_APPTAINER),
        ("image-python", FAKE_PYTHON),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_the_apptainer_stand_in_drops_exported_functions(tmp_path: Path) -> None:
    bin_dir = stand_ins(tmp_path)
    done = subprocess.run(
        ["bash", "-c", "f() { :; }; export -f f; apptainer exec --pwd / i.sif bash -c f"],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 127 and "f: command not found" in done.stderr


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_the_script_runs_the_rank_in_the_image(runtime: str, tmp_path: Path) -> None:
    """Under apptainer the functions cross as the inner bash's command: without them the
    rank (run_rank, exported again inside) would not start."""
    bin_dir = stand_ins(tmp_path)
    workdir = tmp_path / "work"
    workdir.mkdir()
    container = ContainerSpec(
        image="img.sif", runtime=runtime, python=str(bin_dir / "image-python")
    )
    job = spec(
        container,
        python="/nowhere/host-python",
        workdir=str(workdir),
        master_addr="127.0.0.1",
        master_port=29555,
        ifname="lo",
    )
    _, script = prepare_slurm(None, job, SlurmOptions(nodes=1), "r", ARGV, tmp_path / "run")
    (tmp_path / "job.sbatch").write_text(script)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_NNODES": "1",
    }
    done = subprocess.run(
        ["bash", str(tmp_path / "job.sbatch")], env=env, capture_output=True, text=True, timeout=60
    )
    nodes = tmp_path / "run" / "nodes"
    node_out = nodes / "attempt0" / "node0" / "node.out"
    assert done.returncode == 0, done.stderr + (node_out.read_text() if node_out.exists() else "")
    assert (nodes / "ran").read_text() == f"{workdir} -u train.py\n"
    assert (nodes / "attempt0" / "node0" / "rank-0.exit").read_text().startswith("0 ")
    assert (nodes / "attempt0" / "node0" / "node.exit").read_text().startswith("0 ")
