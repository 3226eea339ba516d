"""DeepSpeed/torchrun habits through the real command line: .deepspeed_env, selection flags
(with DeepSpeed's underscore spellings), --bind-cores; rendered, never launched here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.plan.spec import deepspeed_env_files

CLI = [sys.executable, "-m", "orchestrator"]
HOSTS = "worker-0 slots=4\nworker-1 slots=4\nworker-2 slots=4\n"


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder as the current directory and an empty home."""
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    (project / "hosts.txt").write_text(HOSTS)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("DS_ENV_FILE", raising=False)
    monkeypatch.chdir(project)
    return project


def orchestrator(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def render(place: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    done = orchestrator("render", "hosts.txt", "-o", "out", "--run-id", "r", *args, cwd=place)
    plan = yaml.safe_load((place / "out" / "plan.yaml").read_text()) if done.returncode == 0 else {}
    return done, plan


def test_deepspeed_env_files_home_then_cwd(tmp_path: Path) -> None:
    home, cwd = tmp_path / "h", tmp_path / "c"
    home.mkdir()
    cwd.mkdir()
    assert deepspeed_env_files(cwd, home, {}) == []
    (home / ".deepspeed_env").write_text("A=1\n")
    (cwd / ".deepspeed_env").write_text("A=2\n")
    assert deepspeed_env_files(cwd, home, {}) == [home / ".deepspeed_env", cwd / ".deepspeed_env"]
    assert deepspeed_env_files(home, home, {}) == [home / ".deepspeed_env"]
    (cwd / "site.env").write_text("A=3\n")
    assert deepspeed_env_files(cwd, home, {"DS_ENV_FILE": "site.env"}) == [cwd / "site.env"]


def test_deepspeed_env_is_used_said_and_its_secrets_kept_secret(place: Path) -> None:
    (place.parent / "home" / ".deepspeed_env").write_text("NCCL_IB_HCA=mlx5_0\nLEVEL=home\n")
    (place / ".deepspeed_env").write_text(
        "NCCL_SOCKET_IFNAME=ib0\nLEVEL=cwd\nHF_TOKEN=hf_s3cr3t_v4lue\nexport WANDB_API_KEY='k3y'\n"
    )
    done, plan = render(place, "--no-forward-env")
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "env file" in line]
    assert said == [
        f"[orchestrator] env file {place.parent / 'home' / '.deepspeed_env'}, "
        f"{place / '.deepspeed_env'} (DeepSpeed's .deepspeed_env) sets variables "
        "on every node; --no-env-file ignores it"
    ]
    env = plan["nodes"][1]["env"]
    assert env["NCCL_IB_HCA"] == "mlx5_0" and env["LEVEL"] == "cwd"
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert plan["secrets"] == ["HF_TOKEN", "WANDB_API_KEY"]
    for path in (place / "out").iterdir():
        text = path.read_text()
        assert "hf_s3cr3t_v4lue" not in text and "k3y" not in text, path
    assert "s3cr3t" not in done.stdout + done.stderr


def test_no_env_file_turns_it_off_and_env_file_replaces_it(place: Path) -> None:
    (place / ".deepspeed_env").write_text("FROM_DS=1\n")
    (place / "mine.env").write_text("FROM_MINE=1\n")
    done, plan = render(place, "--no-env-file")
    assert done.returncode == 0 and "env file" not in done.stderr
    assert "FROM_DS" not in plan["nodes"][0]["env"]
    done, plan = render(place, "--env-file", "mine.env")
    assert done.returncode == 0 and "env file" not in done.stderr
    assert "FROM_MINE" in plan["nodes"][0]["env"] and "FROM_DS" not in plan["nodes"][0]["env"]
    done = orchestrator(
        "render", "hosts.txt", "-o", "o2", "--env-file", "mine.env", "--no-env-file", cwd=place
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "orchestrator: error: --env-file and --no-env-file together: give one of them"
    )


def test_a_bad_deepspeed_env_line_is_named(place: Path) -> None:
    (place / ".deepspeed_env").write_text("GOOD=1\nnot a pair\n")
    done, _ = render(place)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"orchestrator: error: {place / '.deepspeed_env'}:2: expected NAME=VALUE, got 'not a pair'"
    )


@pytest.mark.parametrize(
    "args", [("--num_nodes", "2", "--num_gpus", "2"), ("--num-nodes", "2", "--num-gpus", "2")]
)
def test_underscore_spellings_and_the_plan_shows_the_selection(place: Path, args) -> None:
    done, plan = render(place, *args)
    assert done.returncode == 0, done.stderr
    assert plan["selection"] == "--num-nodes 2 --num-gpus 2"
    assert [(n["host"], n["slots"], n["env"]["CUDA_VISIBLE_DEVICES"]) for n in plan["nodes"]] == [
        ("worker-0", "0,1", "0,1"),
        ("worker-1", "0,1", "0,1"),
    ]
    assert plan["world_size"] == 4


def test_bind_cores_to_rank_spelling_renders_the_start_time_sets(place: Path) -> None:
    done, plan = render(place, "--bind_cores_to_rank", "--include", "worker-2:1,3")
    assert done.returncode == 0, done.stderr
    node = plan["nodes"][0]
    assert node["cores"] == "(computed at start from the node's own topology)"
    script = (place / "out" / "node0.sh").read_text()
    assert "ORCHESTRATOR_CORE_SETS=$(orchestrator_cores" in script
    assert "export CUDA_VISIBLE_DEVICES=1,3" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--include", "worker-0", "--exclude", "worker-1"), "--include and --exclude together"),
        (("--include", "worker-7"), "--include 'worker-7': host 'worker-7' is not in hosts.txt"),
        (("--exclude", "worker-1:4"), "--exclude 'worker-1:4': host worker-1 has no slot 4"),
        (("--num-nodes", "5"), "--num-nodes 5: hosts.txt lists only 3 host(s)"),
        (("--backend", "slurm", "--num-gpus", "2"), None),  # allowed: a node list
    ],
)
def test_bad_selection_exits_2_in_one_line(place: Path, args, message) -> None:
    done = orchestrator("render", "hosts.txt", "-o", "out", *args, cwd=place)
    if message is None:
        assert done.returncode == 0, done.stderr
        assert "case ${SLURMD_NODENAME:-} in" in (place / "out" / "job.sbatch").read_text()
        return
    assert done.returncode == 2
    assert done.stderr.startswith(f"orchestrator: error: {message}")
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (place / "out").exists()


def test_selection_without_hostfile_under_slurm_is_refused(place: Path) -> None:
    done = orchestrator(
        "render", "--backend", "slurm", "--nodes", "2", "-o", "out", "--num-gpus", "2", cwd=place
    )
    assert done.returncode == 2
    assert "--num-gpus chooses hosts out of a hostfile: give HOSTFILE" in done.stderr


def test_help_names_each_flag_and_what_it_mirrors() -> None:
    for command in ("launch", "render"):
        text = subprocess.run(
            [*CLI, command, "--help"], capture_output=True, text=True, check=True
        ).stdout
        flat = " ".join(text.split())
        for words in (
            "--include",
            "DeepSpeed's --include",
            "DeepSpeed's --exclude",
            "--num-nodes, --num_nodes",
            "DeepSpeed's --num_nodes",
            "--num-gpus, --num_gpus",
            "DeepSpeed's --num_gpus",
            "--bind-cores, --bind_cores_to_rank",
            "DeepSpeed's --bind_cores_to_rank",
            "--no-env-file",
            ".deepspeed_env",
        ):
            assert words in flat, (command, words)
    check = subprocess.run([*CLI, "check", "--help"], capture_output=True, text=True).stdout
    assert "--include" in check and "--num_gpus" in check


NOT_SENT = "CUDA_VISIBLE_DEVICES=0 names this machine's GPUs and is not set on the nodes"


@pytest.mark.parametrize(
    ("args", "on_nodes"),
    [
        ((), None),  # the node's own GPUs, all of them
        (("--include", "worker-1:2"), "2"),  # DeepSpeed's way to choose them
        (("--env", "CUDA_VISIBLE_DEVICES=3"), "3"),  # one value for every node, said explicitly
    ],
)
def test_the_controllers_cuda_visible_devices_stays_here(
    place: Path, monkeypatch, args, on_nodes: str | None
) -> None:
    # Launching from inside a SLURM allocation (or any shell holding one GPU) must not pin
    # every node to that GPU's index: it names this machine's devices, not theirs.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # a plain knob: still forwarded
    done, plan = render(place, *args)
    assert done.returncode == 0, done.stderr
    assert (NOT_SENT in done.stderr) == (on_nodes is None), done.stderr
    for node in plan["nodes"]:
        assert node["env"].get("CUDA_VISIBLE_DEVICES") == on_nodes
        assert node["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    scripts = "".join(p.read_text() for p in (place / "out").glob("node*.sh"))
    assert "CUDA_VISIBLE_DEVICES=0" not in scripts


def test_a_local_job_keeps_the_shells_cuda_visible_devices(place: Path, monkeypatch) -> None:
    # Every node is this machine: its ranks inherit the variable, as torchrun's would.
    (place / "local.txt").write_text("localhost slots=2\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    done = orchestrator("render", "local.txt", "-o", "out", cwd=place)
    assert done.returncode == 0 and NOT_SENT not in done.stderr, done.stderr


def test_slurm_scripts_leave_cuda_visible_devices_to_slurm(place: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    done = orchestrator("render", "--backend", "slurm", "--nodes", "2", "-o", "out", cwd=place)
    assert done.returncode == 0, done.stderr
    assert NOT_SENT in done.stderr
    assert "CUDA_VISIBLE_DEVICES=0" not in (place / "out" / "job.sbatch").read_text()
