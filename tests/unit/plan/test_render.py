"""Rendering: golden files for the node scripts, plan.yaml and the probe script; quoting.

The golden files in tests/golden/ are the exact output for fixed plans, so a template
change shows up as a readable diff. After an intended change, regenerate them with

    UPDATE_GOLDEN=1 pytest tests/unit/plan/test_render.py

and review the diff. Every rendered script is also checked with `bash -n`, and the node
script is executed with a fake interpreter to show that the variables and arguments it
hands over arrive byte for byte.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.agent.programs.cores import Topology
from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.hosts.selection import select_hosts
from orchestrator.nodes.probe import probe_script
from orchestrator.options.choosing import Selection
from orchestrator.plan.launch_plan import LaunchPlan, NodeFacts, make_plan
from orchestrator.plan.scripts import (
    command_line,
    comment_safe,
    plan_yaml,
    render_node_scripts,
    render_template,
    write_rendered,
)
from orchestrator.plan.spec import JobSpec, Program

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
BASH = shutil.which("bash") or "/bin/bash"
PROPERTY = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SECRET = "hf_sEcReT-VALUE-123"


# --- the fixed plans behind the golden files ---------------------------------------------

TWO_NODES_ARGV = (
    "orchestrator",
    "launch",
    "hosts.txt",
    "--env",
    f"HF_TOKEN={SECRET}",
    "--env",
    'GREETING=hello $USER `id` "quoted" it\'s',
    "--workdir",
    "/srv/my project",
    "--",
    "-m",
    "mypkg.train",
    "--lr",
    "0.1",
    "--name",
    "it's a $test",
)


def two_nodes() -> tuple[LaunchPlan, dict[str, str]]:
    """Two nodes: env var, secret, probed + unprobed interface, module program, spaced workdir."""
    cluster = parse_hostfile(
        "node-a slots=2\nalice@node-b:2 port=2222 python=/opt/conda/bin/python\n", "hosts.txt"
    )
    spec = JobSpec(
        program=Program.from_argv(list(TWO_NODES_ARGV[TWO_NODES_ARGV.index("--") + 1 :])),
        python="/usr/bin/python3",
        workdir="/srv/my project",
        env=(
            ("NCCL_DEBUG", "INFO"),
            ("GREETING", 'hello $USER `id` "quoted" it\'s'),
            ("HF_TOKEN", SECRET),
        ),
    )
    facts = {
        0: NodeFacts(
            address="10.1.0.1",
            ifname="ens5",
            route_source="10.1.0.1",
            python_version="3.11.7",
            torch_version="2.4.0",
            free_port=29500,
        )
    }
    plan = make_plan(cluster, spec, "golden-2node", facts)
    return plan, render_node_scripts(plan, command_line(TWO_NODES_ARGV, plan.secret_names))


def single_local() -> tuple[LaunchPlan, dict[str, str]]:
    """This machine, two ranks, a script with arguments, nothing probed."""
    cluster = parse_hostfile("localhost slots=2\n", "hostfiles/local.txt")
    argv = (
        "orchestrator",
        "render",
        "hostfiles/local.txt",
        "-o",
        "out",
        "--run-id",
        "golden-local",
        "--",
        "train.py",
        "--epochs",
        "3",
    )
    spec = JobSpec(
        program=Program.from_argv(["train.py", "--epochs", "3"]),
        python="/usr/bin/python3",
        workdir="/home/user/proj",
        env=(("OMP_NUM_THREADS", "4"),),
    )
    plan = make_plan(cluster, spec, "golden-local")
    return plan, render_node_scripts(plan, command_line(argv))


def selected() -> tuple[LaunchPlan, dict[str, str]]:
    """DeepSpeed habits: --include of 2 of 3 hosts (slots 0,2 of the second), --bind-cores
    with node 0's topology probed (two NUMA nodes) and node 1's computed at its start."""
    cluster = parse_hostfile("worker-0 slots=4\nworker-1 slots=4\nworker-2 slots=4\n", "hosts.txt")
    cluster = select_hosts(cluster, Selection(include="worker-0@worker-1:0,2"))
    argv = (
        "orchestrator",
        "launch",
        "hosts.txt",
        "--include",
        "worker-0@worker-1:0,2",
        "--bind-cores",
    )
    spec = JobSpec(
        program=Program.from_argv([]),
        python="/usr/bin/python3",
        workdir="/home/user/proj",
        bind_cores=True,
        env=(("CUDA_VISIBLE_DEVICES", "7"),),
    )  # forwarded; the selection wins
    facts = {
        0: NodeFacts(
            address="10.1.0.1",
            ifname="ens5",
            free_port=29500,
            topology=Topology.decode("0-7|0:0-3;1:4-7"),
        )
    }
    plan = make_plan(cluster, spec, "golden-selected", facts)
    return plan, render_node_scripts(plan, command_line(argv))


def restarts() -> tuple[LaunchPlan, dict[str, str]]:
    """--max-restarts 2 on three nodes: torchrun's c10d rendezvous, node order kept."""
    cluster = parse_hostfile("node-a slots=2\nnode-b slots=2\nnode-c slots=2\n", "hosts.txt")
    argv = (
        "orchestrator",
        "launch",
        "hosts.txt",
        "--max-restarts",
        "2",
        "--",
        "-m",
        "orchestrator.trainer",
        "--checkpoint-dir",
        "ckpt",
        "--resume",
    )
    spec = JobSpec(
        program=Program.from_argv(list(argv[argv.index("--") + 1 :])),
        python="/usr/bin/python3",
        workdir="/srv/proj",
        max_restarts=2,
    )
    facts = {0: NodeFacts(address="10.1.0.1", free_port=29500)}
    plan = make_plan(cluster, spec, "golden-restarts", facts)
    return plan, render_node_scripts(plan, command_line(argv))


def rendered_files() -> dict[str, str]:
    files = {}
    for folder, make in (
        ("two_nodes", two_nodes),
        ("local", single_local),
        ("selected", selected),
        ("restarts", restarts),
    ):
        plan, scripts = make()
        files[f"{folder}/plan.yaml"] = plan_yaml(plan)
        files.update({f"{folder}/{name}": text for name, text in scripts.items()})
    files["probe/master.sh"] = probe_script(
        "node-a", "/usr/bin/python3", "10.1.0.1", check_port=True, port=None, ifname="ens5"
    )
    files["probe/worker.sh"] = probe_script(
        "node-b", "/opt/conda/bin/python", "10.1.0.1", check_port=False, port=29500, ifname=None
    )
    files["probe/cores.sh"] = probe_script(
        "node-b",
        "/usr/bin/python3",
        "10.1.0.1",
        check_port=False,
        port=None,
        ifname=None,
        bind_cores=True,
    )
    return files


GOLDEN_NAMES = [
    "two_nodes/plan.yaml",
    "two_nodes/node0.sh",
    "two_nodes/node1.sh",
    "local/plan.yaml",
    "local/node0.sh",
    "probe/master.sh",
    "probe/worker.sh",
    "selected/plan.yaml",
    "selected/node0.sh",
    "selected/node1.sh",
    "probe/cores.sh",
    "restarts/plan.yaml",
    "restarts/node0.sh",
    "restarts/node1.sh",
    "restarts/node2.sh",
]


def test_golden_set_is_complete() -> None:
    assert sorted(rendered_files()) == sorted(GOLDEN_NAMES)


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_golden(name: str) -> None:
    text = rendered_files()[name]
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing {path}; run UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(encoding="utf-8"), (
        f"{name} differs from {path}; if the change is intended, regenerate with "
        "UPDATE_GOLDEN=1 pytest tests/unit/plan/test_render.py and review the diff"
    )


def bash_syntax_ok(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, "-n"], input=text.encode(), capture_output=True, timeout=30)


@pytest.mark.parametrize("name", [n for n in GOLDEN_NAMES if n.endswith(".sh")])
def test_rendered_scripts_pass_bash_n(name: str) -> None:
    result = bash_syntax_ok(rendered_files()[name])
    assert result.returncode == 0, result.stderr.decode()


def test_bash_n_would_catch_a_broken_script() -> None:
    assert bash_syntax_ok("if true; then\n echo 'x\n").returncode != 0


def test_two_node_scripts_say_what_they_are() -> None:
    plan, scripts = two_nodes()
    node0, node1 = scripts["node0.sh"], scripts["node1.sh"]
    assert node0.startswith("#!/usr/bin/env bash\n# Generated by orchestrator ")
    assert "node_rank 0 of 2 (node-a): ranks 0-1 of 4" in node0
    assert "node_rank 1 of 2 (node-b): ranks 2-3 of 4" in node1
    assert "export NCCL_SOCKET_IFNAME=ens5" in node0 and "orchestrator_route_ifname" not in node0
    assert 'orchestrator_route_ifname "$MASTER_ADDR"' in node1  # unprobed: found at start
    assert "--nnodes=2 --node_rank=1 --nproc_per_node=2" in node1
    assert "exec /usr/bin/python3 -m torch.distributed.run" in node0  # hosts the store
    # the other nodes join once it answers
    assert 'exec /opt/conda/bin/python -c "$orchestrator_torchrun"' in node1
    assert "cd '/srv/my project'" in node0


# --- secrets -----------------------------------------------------------------------------


def test_golden_plan_has_no_secret_value() -> None:
    plan, scripts = two_nodes()
    assert plan.secret_names == ("HF_TOKEN",)
    for text in [plan_yaml(plan), *scripts.values()]:
        assert SECRET not in text
    assert "HF_TOKEN=***" in scripts["node0.sh"].splitlines()[1]  # the command in the header
    assert ': "${HF_TOKEN:?is a secret this job needs' in scripts["node1.sh"]


@PROPERTY
@given(
    st.text(
        st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1, max_size=30
    ),
    st.sampled_from(["API_KEY", "WANDB_API_KEY", "MY_SETTING", "db_password"]),
    st.booleans(),
)
def test_secret_values_never_reach_scripts_or_plan(
    value: str,
    name: str,
    flag_form: bool,
) -> None:
    secret = "Zq9" + value  # a prefix no template contains, so a hit is a real leak
    cluster = parse_hostfile("a\nb slots=2\n", "h")
    job = JobSpec(
        program=Program.from_argv(["train.py", "--x", "1"]),
        python="/p",
        workdir="/w",
        env=(("PLAIN", "visible"), (name, secret)),
        secret_names=frozenset({"MY_SETTING"}),
    )
    plan = make_plan(cluster, job, "r1")
    env_arg = [f"--env={name}={secret}"] if flag_form else ["--env", f"{name}={secret}"]
    command = command_line(
        ["orchestrator", "launch", "h", *env_arg, "--", "train.py"], plan.secret_names
    )
    scripts = render_node_scripts(plan, command)
    for text in [plan_yaml(plan), *scripts.values()]:
        assert secret not in text
        assert comment_safe(secret) not in text
    assert all("export PLAIN=visible" in text for text in scripts.values())


def test_command_line_masks_secret_env_values_only() -> None:
    argv = [
        "orchestrator",
        "launch",
        "h",
        "--env",
        "TOKEN=abc",
        "--env=PASSWORD=x y",
        "--env",
        "PLAIN=1",
        "--",
        "train.py",
        "TOKEN=abc",
    ]
    shown = command_line(argv, ["TOKEN", "PASSWORD"])
    assert "abc" not in shown and "x y" not in shown
    assert "--env 'TOKEN=***' '--env=PASSWORD=***' --env PLAIN=1 --" in shown
    assert command_line(["a b", "c"]) == "'a b' c"


# --- quoting: what the script hands over arrives byte for byte ---------------------------

VALUE = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40)
NASTY = [
    "",
    " ",
    "two words",
    "it's",
    '"double"',
    "$HOME",
    "${HOME}",
    "$(id)",
    "`id`",
    "a\nb",
    "trailing\n",
    "\ttab",
    "back\\slash",
    "semi;colon && or || pipe |",
    "glob * ? [a]",
    "~",
    "~/x",
    "!",
    "#not a comment",
    "é ü 日本 🚀",
    "\r\n",
    "'\"'\"'",
    "-n",
    "--flag=1",
    "=",
    "a=b",
    "\x1b[31mred\x1b[0m",
    "\u2028",
    "%s %d",
    "\x7f",
]


def fake_python(directory: Path, out: Path) -> Path:
    """An interpreter stand-in: as torchrun it records its view, then runs one rank
    (RANK=0) the way torchrun --no-python would; as a rank it prints and exits 3."""
    path = directory / "python"
    path.write_text(
        f"""#!{BASH}
if [ "$1" = "-m" ] && [ "$2" = "torch.distributed.run" ]; then
    env -0 > '{out}/env'
    pwd > '{out}/pwd'
    printf '%s\\0' "$@" > '{out}/argv'
    while [ "$1" != "--no-python" ]; do shift; done
    shift
    RANK=0 LOCAL_RANK=0 exec "$@"
fi
printf 'rank %s:' "$RANK"
printf ' <%s>' "$@"
printf '\\n'
exit 3
""",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


def run_node_script(
    tmp: Path,
    env_pairs,
    program_args,
    *,
    synced: bool = False,
    extra_env: dict[str, str] | None = None,
):
    """Render node0.sh of a one-node plan whose python is fake_python, and run it."""
    out = tmp / "out"
    out.mkdir()
    home = tmp / "home"
    home.mkdir()
    workdir = tmp / "work dir"
    workdir.mkdir()
    node_dir = tmp / "node"
    node_dir.mkdir()
    python = fake_python(tmp, out)
    job = JobSpec(
        program=Program.from_argv(["train.py", *program_args]),
        python=str(python),
        workdir=str(workdir),
        env=tuple(env_pairs),
        ifname="lo",
        sync_dir=str(tmp / "proj") if synced else None,
    )
    plan = make_plan(parse_hostfile("localhost slots=1\n", "h"), job, "r1")
    if synced:
        (home / plan.nodes[0].workdir[2:]).mkdir(parents=True)
    script = tmp / "node0.sh"
    script.write_text(render_node_scripts(plan, "orchestrator test")["node0.sh"], encoding="utf-8")
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ORCHESTRATOR_NODE_DIR": str(node_dir),
        **(extra_env or {}),
    }
    result = subprocess.run([BASH, str(script)], env=environ, capture_output=True, timeout=30)
    if not (out / "env").exists():  # the script stopped before starting torchrun
        return result, plan, None, None, None, node_dir
    env = dict(item.split(b"=", 1) for item in (out / "env").read_bytes().split(b"\0") if item)
    argv = (out / "argv").read_bytes().split(b"\0")[:-1]
    return result, plan, env, argv, (out / "pwd").read_text().strip(), node_dir


def test_node_script_runs_with_the_plan_env_workdir_and_argv(tmp_path) -> None:
    pairs = [(f"ORCHTEST_{i}", value) for i, value in enumerate(NASTY)]
    result, plan, env, argv, pwd, node_dir = run_node_script(tmp_path, pairs, NASTY)
    assert result.returncode == 3, result.stderr.decode()  # the rank's exit code comes back
    for name, value in pairs:
        assert env[name.encode()] == value.encode(), name
    assert env[b"MASTER_ADDR"] == b"127.0.0.1" and env[b"MASTER_PORT"] == b"29500"
    assert env[b"NCCL_SOCKET_IFNAME"] == b"lo" and env[b"ORCHESTRATOR_RUN_ID"] == b"r1"
    assert pwd == str(tmp_path / "work dir")
    python = plan.nodes[0].python.encode()
    assert argv[:9] == [
        b"-m",
        b"torch.distributed.run",
        b"--nnodes=1",
        b"--node_rank=0",
        b"--nproc_per_node=1",
        b"--master_addr=127.0.0.1",
        b"--master_port=29500",
        f"--log-dir={node_dir}/torchrun".encode(),
        b"--no-python",
    ]
    assert argv[-len(NASTY) - 3 :] == [python, b"-u", b"train.py", *(a.encode() for a in NASTY)]
    # run_rank: the rank's output and its exit record land in ORCHESTRATOR_NODE_DIR
    out = (node_dir / "rank-0.out").read_bytes()
    assert (
        out
        == b"rank 0: <-u> <train.py>" + b"".join(b" <" + a.encode() + b">" for a in NASTY) + b"\n"
    )
    rc, when, error_file = (node_dir / "rank-0.exit").read_text().split(" ")
    assert rc == "3" and float(when) > 0 and error_file == "\n"


@PROPERTY
@given(st.lists(VALUE, min_size=1, max_size=6), st.lists(VALUE, max_size=4))
def test_env_values_and_args_arrive_byte_identical(tmp_path_factory, values, args) -> None:
    tmp = tmp_path_factory.mktemp("run")
    pairs = [(f"ORCHTEST_{i}", value) for i, value in enumerate(values)]
    result, _, env, argv, _, _ = run_node_script(tmp, pairs, args)
    assert result.returncode == 3, result.stderr.decode()
    assert [env[name.encode()] for name, _ in pairs] == [v.encode() for v in values]
    assert argv[len(argv) - len(args) :] == [a.encode() for a in args]


@pytest.mark.parametrize("node_dir", ["node dir", ""])
def test_torchrun_keeps_its_files_in_the_node_directory(tmp_path, node_dir: str) -> None:
    """torchrun's own folder (--log-dir) is in the node directory, one argument whatever its
    name; run by hand (no node directory), torchrun keeps its default."""
    folder = tmp_path / node_dir if node_dir else None
    if folder is not None:
        folder.mkdir()
    extra = {"ORCHESTRATOR_NODE_DIR": str(folder) if folder else ""}
    result, _, _, argv, _, _ = run_node_script(tmp_path, [], [], extra_env=extra)
    assert result.returncode == 3, result.stderr.decode()
    wanted = [f"--log-dir={folder}/torchrun".encode()] if folder else []
    assert [arg for arg in argv if arg.startswith(b"--log")] == wanted


@pytest.mark.parametrize("by_the_agent", [True, False])
def test_a_jobs_pythonpath_keeps_the_stack_hook_first(tmp_path, by_the_agent: bool) -> None:
    """The job's PYTHONPATH (--env, or forwarded from the shell) goes after the stack hook's
    folder where the agent runs the script (which names the folder), and is the job's alone
    by hand."""
    extra = {"ORCHESTRATOR_STACK_HOOK": "/node/stack_hook"} if by_the_agent else {}
    pairs = [("PYTHONPATH", "/my lib:/other")]
    result, _, env, _, _, _ = run_node_script(tmp_path, pairs, [], extra_env=extra)
    assert result.returncode == 3, result.stderr.decode()
    hook_first = b"/node/stack_hook:" if by_the_agent else b""
    assert env[b"PYTHONPATH"] == hook_first + b"/my lib:/other"


def test_synced_workdir_is_under_the_node_home(tmp_path) -> None:
    result, plan, _, _, pwd, _ = run_node_script(tmp_path, [], [], synced=True)
    assert result.returncode == 3, result.stderr.decode()
    assert plan.nodes[0].workdir == "~/.orchestrator/runs/r1/node0/proj"
    assert pwd == str(tmp_path / "home" / ".orchestrator/runs/r1/node0/proj")


@pytest.mark.parametrize("given_secret", [False, True])
def test_secret_is_required_from_the_environment(tmp_path, given_secret: bool) -> None:
    pairs = [("ORCHTEST", "x"), ("MY_TOKEN", "never-written")]
    extra = {"MY_TOKEN": "handed-over"} if given_secret else {}
    result, _, env, _, _, _ = run_node_script(tmp_path, pairs, [], extra_env=extra)
    assert b"never-written" not in (tmp_path / "node0.sh").read_bytes()
    if given_secret:  # as the agent does at launch: the job sees the value
        assert result.returncode == 3 and env[b"MY_TOKEN"] == b"handed-over"
    else:  # run by hand without it: stops before torchrun, naming the variable
        assert env is None and result.returncode != 0
        assert b"MY_TOKEN: is a secret this job needs" in result.stderr


@PROPERTY
@given(st.text(st.characters(exclude_categories=["Cs"]), max_size=40))
def test_comment_safe_keeps_comments_on_one_line(text: str) -> None:
    shown = comment_safe(text)
    assert shown.isprintable() and len(shown.splitlines()) <= 1
    script = f"# {shown}\nexit 0\n"
    assert bash_syntax_ok(script).returncode == 0


def test_header_command_with_newlines_stays_a_comment() -> None:
    plan, _ = single_local()
    scripts = render_node_scripts(plan, command_line(["orchestrator", "x\ny", "$(reboot)"]))
    header = scripts["node0.sh"].splitlines()[1]
    assert header.startswith("# Generated by orchestrator") and "x\\ny" in header
    assert bash_syntax_ok(scripts["node0.sh"]).returncode == 0


# --- write_rendered and the template environment -----------------------------------------


def test_write_rendered_writes_plan_and_executable_scripts(tmp_path) -> None:
    plan, scripts = two_nodes()
    written = write_rendered(tmp_path / "out", plan, scripts)
    assert [p.name for p in written] == ["plan.yaml", "node0.sh", "node1.sh"]
    assert yaml.safe_load((tmp_path / "out" / "plan.yaml").read_text()) == plan.to_dict()
    for path in written[1:]:
        assert path.stat().st_mode & stat.S_IXUSR
        assert path.read_text() == scripts[path.name]


def test_templates_use_strict_undefined() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render_template("node.sh.j2", plan=two_nodes()[0])


def test_restarts_use_c10d_with_node_order_and_only_when_asked() -> None:
    plan, scripts = restarts()
    for k, name in enumerate(["node0.sh", "node1.sh", "node2.sh"]):
        script = scripts[name]
        assert "--max-restarts=2" in script and "--rdzv-backend=c10d" in script
        assert "--rdzv-id=golden-restarts" in script and "--node_rank" not in script
        assert f"--rdzv-conf=is_host={1 if k == 0 else 0}" in script
    # c10d sorts nodes by --local-addr: node 0 first, then the others in node_rank order.
    addrs = [
        re.search(r'--local-addr="\$MASTER_ADDR([^"]*)"', scripts[f"node{k}.sh"]).group(1)
        for k in range(3)
    ]
    assert addrs[0] == "" and sorted(addrs) == addrs
    assert "max_restarts: '2  # torchrun --max-restarts" in plan_yaml(plan)
    _, plain = two_nodes()
    assert "rdzv" not in plain["node0.sh"] and "--node_rank=0" in plain["node0.sh"]
