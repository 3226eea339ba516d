"""--container on the SSH backend: the options, the hostfile's `container:`, the node script's
two halves (run with a stand-in runtime that runs the script as the image would), the
probe's verdicts and the agent's part. The real runtime is in
tests/cluster/test_container_cluster.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.agent.runtime import carried_names, chosen_runtime, remove
from orchestrator.errors import ConfigError, SourceError
from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.nodes.probe import container_problem
from orchestrator.options.image import ContainerOptions
from orchestrator.plan.container import (
    ContainerSpec,
    Mount,
    container_name,
    job_container,
    parse_mounts,
)
from orchestrator.plan.launch_plan import NodeFacts, make_plan
from orchestrator.plan.scripts import plan_yaml, render_node_scripts
from orchestrator.plan.spec import JobSpec, Program

BASH = shutil.which("bash") or "/bin/bash"
SECRET = "tok-0123456789abcdef"
IMAGE = "registry.example/team/pytorch:2.13"


def test_mounts_are_parsed_and_bad_ones_say_how_to_write_them() -> None:
    assert parse_mounts("/data:/data:ro, ~/ckpt:/ckpt") == (
        Mount("/data", "/data", read_only=True),
        Mount("~/ckpt", "/ckpt"),
    )
    for bad, words in (
        ("/data", "expected SOURCE:TARGET"),
        ("/a:/b:rx", "expected SOURCE:TARGET"),
        ("data:/data", "absolute path or ~/"),
        ("/data:data", "target must be an absolute path"),
    ):
        with pytest.raises(ConfigError, match=words):
            parse_mounts(bad)


def test_the_spec_refuses_what_no_runtime_takes() -> None:
    with pytest.raises(ConfigError, match="expected an image name"):
        ContainerSpec(image="img; rm -rf /")
    with pytest.raises(ConfigError, match="expected one of auto, docker"):
        ContainerSpec(image=IMAGE, runtime="lxc")
    with pytest.raises(ConfigError, match="absolute path in the image"):
        ContainerSpec(image=IMAGE, workdir="work")


def test_flags_over_the_hostfile_and_each_backend_its_runtimes() -> None:
    cluster = parse_hostfile(
        "hosts:\n  - node1\ncontainer:\n  image: base:1\n  mounts: [/data:/data:ro]\n"
        "  args: --shm-size=8g\n",
        "hosts.yaml",
    )
    assert cluster.container_source == "hosts.yaml:3"
    hash(cluster)  # still a frozen value, as every Cluster
    spec = job_container(
        cluster.container, cluster.container_source, "ssh", ContainerOptions(container=IMAGE)
    )
    assert spec == ContainerSpec(
        image=IMAGE, mounts=(Mount("/data", "/data", True),), args=("--shm-size=8g",)
    )
    assert job_container(None, "", "ssh", ContainerOptions()) is None
    with pytest.raises(ConfigError, match="--container-mounts given without --container IMAGE"):
        job_container(None, "", "ssh", ContainerOptions(container_mounts="/a:/b"))
    with pytest.raises(ConfigError, match="does not run under the slurm backend"):
        job_container(
            None, "", "slurm", ContainerOptions(container=IMAGE, container_runtime="docker")
        )
    with pytest.raises(ConfigError, match="does not run under the ssh backend"):
        job_container(None, "", "ssh", ContainerOptions(container=IMAGE, container_runtime="pyxis"))


def test_a_bad_container_in_the_hostfile_names_its_line() -> None:
    text = "hosts:\n  - node1\ncontainer:\n  image: base:1\n  mount: /a:/b\n"
    cluster = parse_hostfile(text, "hosts.yaml")
    with pytest.raises(SourceError) as caught:
        job_container(cluster.container, cluster.container_source, "ssh", ContainerOptions())
    assert str(caught.value).startswith("hosts.yaml:3: unknown container key 'mount'")
    with pytest.raises(SourceError, match="hosts.yaml:4: container image must be a value"):
        parse_hostfile("hosts:\n  - node1\ncontainer:\n  image: {a: 1}\n", "hosts.yaml")


def fake_runtime(directory: Path, out: Path) -> Path:
    """`podman` as the image would run the script: records its argv, then runs the named
    script with ORCHESTRATOR_IN_CONTAINER=1, in --workdir, with the runtime's stdin and no
    other variable of the host's but PATH (a fresh container's environment)."""
    path = directory / "podman"
    path.write_text(
        f"""#!{BASH}
printf '%s\\0' "$@" > '{out}/runtime-argv'
while [ "$#" -gt 2 ]; do
    case $1 in --workdir) workdir=$2; shift;; esac
    shift
done
cd "$workdir"
exec env -i PATH="$PATH" ORCHESTRATOR_IN_CONTAINER=1 {BASH} "$2"
""",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


def fake_python(directory: Path, out: Path) -> Path:
    """The image's python as torchrun: records the environment the ranks would get."""
    path = directory / "python3"
    path.write_text(f"#!{BASH}\nenv -0 > '{out}/env'\npwd > '{out}/pwd'\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def test_the_script_runs_itself_in_the_image_with_the_environment_on_stdin(tmp_path) -> None:
    out, bin_dir, work, node_dir = (tmp_path / d for d in ("out", "bin", "work", "node"))
    for folder in (out, bin_dir, work, node_dir):
        folder.mkdir()
    fake_runtime(bin_dir, out)
    fake_python(bin_dir, out)
    job = JobSpec(
        program=Program.from_argv(["train.py"]),
        python="/host/python",
        workdir=str(work),
        env=(("GREETING", "it's $HOME"), ("HF_TOKEN", SECRET)),
        ifname="lo",
        container=ContainerSpec(image=IMAGE, runtime="podman", mounts=parse_mounts("/d:/d:ro")),
    )
    plan = make_plan(parse_hostfile("node1 slots=1\n", "h"), job, "run-1")
    script = tmp_path / "node0.sh"
    text = render_node_scripts(plan, "orchestrator test")["node0.sh"]
    assert SECRET not in text
    script.write_text(text, encoding="utf-8")
    environ = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "ORCHESTRATOR_NODE_DIR": str(node_dir),
        "HF_TOKEN": SECRET,  # as the agent hands a secret to the script
        "ORCHESTRATOR_CONTAINER_ENV": "ORCHESTRATOR_NODE_DIR",
        "HOST_ONLY": "stays on the host",
    }
    done = subprocess.run([BASH, str(script)], env=environ, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    argv = (out / "runtime-argv").read_bytes().decode().split("\0")[:-1]
    assert SECRET not in " ".join(argv)
    assert argv[:6] == ["run", "--rm", "-i", "--name", "orchestrator-run-1-node0", "--network"]
    assert argv[argv.index("--ipc") : argv.index("--ipc") + 2] == ["--ipc", "host"]
    assert f"--user {os.getuid()}:{os.getgid()}" in " ".join(argv)
    volumes = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--volume"]
    assert volumes == [
        f"{script}:{script}:ro",
        f"{work}:{work}",
        f"{node_dir}:{node_dir}",
        "/d:/d:ro",
    ]
    assert argv[-3:] == [IMAGE, "bash", str(script)]
    env = dict(
        item.split("=", 1) for item in (out / "env").read_bytes().decode().split("\0") if item
    )
    assert env["HF_TOKEN"] == SECRET  # crossed on stdin
    assert env["GREETING"] == "it's $HOME"  # exported inside, from the script
    assert env["ORCHESTRATOR_NODE_DIR"] == str(node_dir)
    assert "HOST_ONLY" not in env
    assert (out / "pwd").read_text().strip() == str(work)
    assert (node_dir / "container.runtime").read_text() == "podman\n"
    assert SECRET not in (node_dir / "container.command").read_text()


def test_plan_yaml_says_the_container_and_each_node_its_runtime_and_name() -> None:
    job = JobSpec(
        program=Program.from_argv(["t.py"]),
        python="/host/python",
        workdir="/w",
        container=ContainerSpec(image=IMAGE, python="/opt/py/bin/python"),
    )
    facts = {0: NodeFacts(container_runtime="docker")}
    plan = make_plan(parse_hostfile("a\nb\n", "h"), job, "r", facts)
    shown = plan_yaml(plan)
    assert f"image: {IMAGE}" in shown
    assert "container: docker, named orchestrator-r-node0\n" in shown
    assert "container: auto, named orchestrator-r-node1 (chosen at start)" in shown
    scripts = render_node_scripts(plan, "x")
    assert "exec /opt/py/bin/python -m torch.distributed.run" in scripts["node0.sh"]
    assert "/host/python" not in scripts["node0.sh"]
    assert container_name("a/b c", 3) == "orchestrator-a_b_c-node3"
    assert container_name("r", 3, attempt=2) == "orchestrator-r-attempt2-node3"


@pytest.mark.parametrize(
    ("values", "words"),
    [
        (
            {"container_runtime": "podman", "container_image": "missing", "container_error": "x"},
            f"image {IMAGE} is not on this node (podman: x); pull it there first",
        ),
        ({"container_error": "no container runtime"}, "no container runtime"),
        (
            {"container_runtime": "podman", "container_torch_version": "none"},
            f"torch is not installed for python3 in image {IMAGE}",
        ),
        (
            {"container_torch_version": "2.13.0", "container_orchestrator": "no"},
            "has no orchestrator package",
        ),
    ],
)
def test_the_probe_says_what_keeps_the_image_from_running(values, words) -> None:
    problem = container_problem("node7", ContainerSpec(image=IMAGE), values)
    assert problem is not None and problem.host == "node7" and problem.exit_code == 2
    assert words in str(problem)
    fine = {"container_torch_version": "2.13.0", "container_orchestrator": "yes"}
    assert container_problem("node7", ContainerSpec(image=IMAGE), fine) is None


def test_the_agent_carries_what_it_set_and_removes_the_container(tmp_path, monkeypatch) -> None:
    names = carried_names(
        {"A": "1", "B": "2", "SHLVL": "3", "HOME": "/h"}, {"HOME": "/h", "B": "0"}
    )
    assert names == "A B"
    assert chosen_runtime(str(tmp_path), "docker") == "docker"
    assert chosen_runtime(str(tmp_path), "auto") is None  # the script wrote nothing
    (tmp_path / "container.runtime").write_text("podman\n")
    assert chosen_runtime(str(tmp_path), "auto") == "podman"
    assert chosen_runtime(str(tmp_path), "apptainer") is None  # no names, nothing to remove
    runtime = tmp_path / "podman"
    runtime.write_text(f'#!{BASH}\necho "$@" >> {tmp_path}/calls\necho "$ANSWER" >&2\nexit $RC\n')
    runtime.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("ANSWER", "Error: no container with name or ID x found")
    monkeypatch.setenv("RC", "1")
    assert remove("podman", "x") is None  # already gone: nothing to say
    monkeypatch.setenv("ANSWER", "Error: permission denied")
    assert (
        remove("podman", "x")
        == "could not remove container x (podman rm): Error: permission denied"
    )
    assert (tmp_path / "calls").read_text() == "rm --force x\n" * 2
