"""Multi-node over SSH, end to end on the namespace cluster: real sshd, real torchrun, gloo."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.hostlist import compress_hosts, expand_range
from tests.cli_helpers import assert_nothing_left, run_cli, status_of, wait_until

pytestmark = pytest.mark.cluster

DDP_CHECK = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    gathered = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([float(rank)]))
    ok = (value.item() == world * (world - 1) / 2
          and [g.item() for g in gathered] == list(range(world)))
    print(f"rank {rank}/{world} node_rank {os.environ['GROUP_RANK']} sum {value.item():g} "
          f"ok {ok} master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
          f"ifname {os.environ.get('GLOO_SOCKET_IFNAME')}/{os.environ.get('NCCL_SOCKET_IFNAME')}")
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)
""")

ENV_REPORT = textwrap.dedent("""
    import os, sys
    for name in sys.argv[1:]:
        print(f"{name}={os.environ.get(name, '<unset>')}")
""")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "ddp.py").write_text(DDP_CHECK)
    (tmp_path / "env_report.py").write_text(ENV_REPORT)
    return tmp_path


def cli(cluster, workdir: Path, *args: str, env: dict | None = None, timeout: float = 300):
    return run_cli(list(args), cwd=workdir, env=cluster.environ(env), timeout=timeout)


def launch_args(workdir: Path, hostfile: Path, run_id: str, *rest: str) -> list[str]:
    return [
        "launch",
        str(hostfile),
        "--run-dir",
        str(workdir / "runs"),
        "--run-id",
        run_id,
        "--color",
        "never",
        *rest,
    ]


def torchrun_folders(cluster) -> list[set[str]]:
    """Each node's torchelastic_* folders, where torchrun makes one when not given --log-dir
    (its login's temporary folder, as the node's torchrun sees it)."""
    command = 'ls -d "${TMPDIR:-/tmp}"/torchelastic_* 2>/dev/null'
    return [set(cluster.ssh_run(node, command)[1].split()) for node in cluster.nodes]


def test_six_rank_ddp_job_across_three_nodes(cluster, workdir: Path) -> None:
    hostfile = cluster.write_hostfile(workdir / "cluster.txt", slots=2)
    before = torchrun_folders(cluster)
    done = cli(cluster, workdir, *launch_args(workdir, hostfile, "ddp6", "--", "ddp.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    master = cluster.nodes[0].address
    for node_rank, node in enumerate(cluster.nodes):
        for rank in (2 * node_rank, 2 * node_rank + 1):
            pattern = (
                rf"^\[{node.name} r{rank}\] rank {rank}/6 node_rank {node_rank} sum 15 "
                rf"ok True master {re.escape(master)}:\d+ ifname eth0/eth0$"
            )
            assert re.search(pattern, done.stdout, re.M), (pattern, done.stdout)
    record = workdir / "runs" / "ddp6"
    assert sorted(p.name for p in (record / "logs").glob("rank-*.log")) == [
        f"rank-{r}.log" for r in range(6)
    ]
    assert sorted(p.name for p in record.glob("node*.sh")) == ["node0.sh", "node1.sh", "node2.sh"]
    plan = yaml.safe_load((record / "plan.yaml").read_text())
    assert plan["master_addr"].startswith(f"{master}  #")
    assert all(node["ifname"].startswith("eth0  # probed:") for node in plan["nodes"])
    status = status_of(workdir / "runs", "ddp6")
    assert status["backend"] == "ssh" and status["state"] == "succeeded"
    assert [n["state"] for n in status["nodes"]] == ["succeeded"] * 3
    assert_nothing_left("ddp6")
    after = torchrun_folders(cluster)
    gained = [sorted(now - was) for was, now in zip(before, after, strict=True)]
    assert gained == [[]] * 3, f"torchrun's folders left on the nodes: {gained}"


def test_interface_is_chosen_per_node(make_cluster, tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text(DDP_CHECK)
    with make_cluster(2) as small:
        other = small.nodes[1]
        for step in (
            ["ip", "link", "set", "eth0", "down"],
            ["ip", "link", "set", "eth0", "name", "ib0"],
            ["ip", "link", "set", "ib0", "up"],
        ):
            small.exec_in(other, step, check=True)
        hostfile = small.write_hostfile(tmp_path / "hosts.txt", slots=1)
        dry = run_cli(
            ["launch", str(hostfile), "--dry-run", "--", "ddp.py"],
            cwd=tmp_path,
            env=small.environ(),
        )
        assert dry.returncode == 0, dry.stderr
        assert re.search(r"ifname: 'eth0  # probed: \S+ reaches", dry.stdout), dry.stdout
        assert re.search(r"ifname: 'ib0  # probed: \S+ reaches", dry.stdout), dry.stdout
        assert "export GLOO_SOCKET_IFNAME=ib0" in dry.stdout
        done = run_cli(
            ["launch", str(hostfile), "--run-dir", str(tmp_path / "runs"), "--", "ddp.py"],
            cwd=tmp_path,
            env=small.environ(),
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(rf"^\[{other.name} r1\] .* ifname ib0/ib0$", done.stdout, re.M)
        forced = run_cli(
            ["launch", str(hostfile), "--ifname", "eth0", "--dry-run", "--", "ddp.py"],
            cwd=tmp_path,
            env=small.environ(),
        )
        assert forced.returncode == 2, forced.stdout + forced.stderr
        assert f"{other.name}: network interface 'eth0' does not exist" in forced.stderr


def test_loopback_master_is_refused_for_several_nodes(cluster, workdir: Path) -> None:
    hostfile = workdir / "mixed.txt"
    hostfile.write_text(f"localhost slots=1\n{cluster.nodes[1].name} slots=1\n")
    done = cli(cluster, workdir, "launch", str(hostfile), "--dry-run", "--", "ddp.py")
    assert done.returncode == 2
    assert "loopback" in done.stderr and "--master-addr" in done.stderr


def test_host_keys_unknown_refused_changed_refused_new_accepted(cluster, workdir: Path) -> None:
    hostfile = cluster.write_hostfile(workdir / "hosts.txt")
    target = cluster.nodes[2]
    try:
        cluster.write_known_hosts(cluster.nodes[:2])
        refused = cli(cluster, workdir, "exec", str(hostfile), "--", "true")
        assert refused.returncode == 2
        assert re.search(rf"{target.name}: host key of \S+ is not in .*known_hosts", refused.stderr)
        assert "--accept-new-host-keys" in refused.stderr
        assert cluster.nodes[0].name not in refused.stderr

        accepted = cli(
            cluster, workdir, "exec", str(hostfile), "--accept-new-host-keys", "--", "true"
        )
        assert accepted.returncode == 0, accepted.stderr
        recorded = (cluster.home / ".ssh" / "known_hosts").read_text()
        assert target.host_public_key.split()[1] in recorded
        again = cli(cluster, workdir, "exec", str(hostfile), "--", "true")
        assert again.returncode == 0, again.stderr

        cluster.write_known_hosts(
            changed={
                target.name: __import__(
                    "tests.lab.ssh", fromlist=["wrong_host_key"]
                ).wrong_host_key()
            }
        )
        changed = cli(
            cluster, workdir, "exec", str(hostfile), "--accept-new-host-keys", "--", "true"
        )
        assert changed.returncode == 2
        assert f"{target.name}: host key of" in changed.stderr and "CHANGED" in changed.stderr
        assert "ssh-keygen -R" in changed.stderr
    finally:
        cluster.write_known_hosts()


def test_unreachable_node_is_named_before_anything_starts(cluster, workdir: Path) -> None:
    ghost = str(cluster.subnet.network_address + 250)
    hostfile = workdir / "hosts.txt"
    hostfile.write_text(f"{cluster.nodes[0].name} slots=1\n{ghost} slots=1\n")
    started = time.monotonic()
    done = cli(
        cluster,
        workdir,
        *launch_args(workdir, hostfile, "ghost", "--connect-timeout", "3", "--", "ddp.py"),
    )
    took = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(rf"{re.escape(ghost)}: (no answer from|cannot connect to) ", done.stderr)
    assert took < 20, f"took {took:.1f} s with a 3 s connect timeout"
    assert "Traceback" not in done.stderr
    assert not (workdir / "runs" / "ghost").exists()
    assert_nothing_left("ghost", within=1)


def test_unknown_host_refused_connection_and_wrong_user(cluster, workdir: Path) -> None:
    node = cluster.nodes[0]
    unknown_file = workdir / "unknown.txt"
    unknown_file.write_text(f"{node.name}\nno-such-node.invalid\n")
    unknown = cli(cluster, workdir, *launch_args(workdir, unknown_file, "unknown", "--", "ddp.py"))
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "no-such-node.invalid: cannot resolve host name 'no-such-node.invalid'" in unknown.stderr
    assert "Traceback" not in unknown.stderr and not (workdir / "runs" / "unknown").exists()
    assert_nothing_left("unknown", within=1)
    refused_file = workdir / "refused.txt"
    refused_file.write_text(f"{node.name} port=2\n")
    refused = cli(cluster, workdir, "exec", str(refused_file), "--", "true")
    assert refused.returncode == 1
    assert f"{node.name}: connection refused at {node.name}:2" in refused.stderr
    user_file = workdir / "user.txt"
    user_file.write_text(f"no-such-user@{node.name}\n")
    wrong = cli(cluster, workdir, "exec", str(user_file), "--", "true")
    assert wrong.returncode == 2
    assert f"{node.name}: authentication failed as no-such-user@" in wrong.stderr


def test_busy_explicit_port_is_an_error_and_auto_picks_another(cluster, workdir: Path) -> None:
    hostfile = cluster.write_hostfile(workdir / "hosts.txt", nodes=[0, 1])
    listener = cluster.popen_in(
        cluster.nodes[0],
        [
            "python3",
            "-c",
            (
                "import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
                "socket.SO_REUSEADDR, 1); s.bind(('', 29500)); s.listen(); time.sleep(120)"
            ),
        ],
    )
    try:
        time.sleep(1)
        busy = cli(
            cluster,
            workdir,
            *launch_args(workdir, hostfile, "busy", "--master-port", "29500", "--", "ddp.py"),
        )
        assert busy.returncode == 2, busy.stdout + busy.stderr
        assert f"{cluster.nodes[0].name}: MASTER_PORT 29500 is already in use" in busy.stderr
        assert not (workdir / "runs" / "busy").exists()
        auto = cli(cluster, workdir, *launch_args(workdir, hostfile, "auto", "--", "ddp.py"))
        assert auto.returncode == 0, auto.stdout + auto.stderr
        port = int(re.search(r"master \S+:(\d+)", auto.stdout).group(1))
        assert port != 29500
        plan = yaml.safe_load((workdir / "runs" / "auto" / "plan.yaml").read_text())
        assert "auto: a port checked free on the master" in plan["master_port"]
        assert_nothing_left("busy", within=1)
        assert_nothing_left("auto")
    finally:
        listener.kill()
        listener.wait()


def test_node_whose_python_lacks_torch_is_named(cluster, workdir: Path) -> None:
    bare = workdir / "bare-venv"  # an interpreter without torch, on the shared file system
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    bare_python = str(bare / "bin" / "python")
    assert cluster.exec_in(cluster.nodes[1], [bare_python, "-c", "import torch"]).returncode
    hostfile = workdir / "hosts.yaml"
    hostfile.write_text(
        yaml.safe_dump(
            [
                {"host": cluster.nodes[0].name, "slots": 1},
                {"host": cluster.nodes[1].name, "slots": 1, "python": bare_python},
            ]
        )
    )
    done = cli(cluster, workdir, *launch_args(workdir, hostfile, "notorch", "--", "ddp.py"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{cluster.nodes[1].name}: torch is not installed for {bare_python}" in done.stderr
    assert f"{cluster.nodes[0].name}:" not in done.stderr, "only the node without torch is named"
    assert "Traceback" not in done.stderr
    assert not (workdir / "runs" / "notorch").exists()
    missing = workdir / "missing.yaml"
    missing.write_text(
        yaml.safe_dump(
            [{"host": cluster.nodes[0].name, "python": "/nope/py"}, {"host": cluster.nodes[1].name}]
        )
    )
    gone = cli(cluster, workdir, *launch_args(workdir, missing, "nopy", "--", "ddp.py"))
    assert gone.returncode == 2, gone.stdout + gone.stderr
    assert (
        f"{cluster.nodes[0].name}: cannot run python '/nope/py': not found on this node; "
        "pass --python PATH"
    ) in gone.stderr
    assert "Traceback" not in gone.stderr
    assert_nothing_left("notorch", within=1)
    assert_nothing_left("nopy", within=1)


def test_environment_reaches_every_node_and_secrets_stay_secret(cluster, workdir: Path) -> None:
    hostfile = cluster.write_hostfile(workdir / "hosts.txt")
    (workdir / "job.env").write_text("# comment\nexport FROM_FILE='file value'\n")
    secret = "s3cr3t-Value-9f2"
    names = ["NCCL_DEBUG", "TORCH_CPP_LOG_LEVEL", "FOO", "FROM_FILE", "HF_TOKEN"]
    done = cli(
        cluster,
        workdir,
        *launch_args(
            workdir,
            hostfile,
            "envs",
            "--env",
            "FOO=a b $c",
            "--env-file",
            "job.env",
            "--env",
            f"HF_TOKEN={secret}",
            "--keep-node-logs",  # the nodes' copies are looked at below
            "--",
            "env_report.py",
            *names,
        ),
        env={"NCCL_DEBUG": "WARN", "TORCH_CPP_LOG_LEVEL": "ERROR"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    record = workdir / "runs" / "envs"
    expected = ["NCCL_DEBUG=WARN", "TORCH_CPP_LOG_LEVEL=ERROR", "FOO=a b $c"]
    expected += ["FROM_FILE=file value", "HF_TOKEN=***"]
    for rank in range(len(cluster.nodes)):  # what each rank printed, in its own file
        assert (record / "logs" / f"rank-{rank}.log").read_text().splitlines() == expected
    ranks = sorted(f"r{rank}" for rank in range(len(cluster.nodes)))
    for line in expected:  # the console: once for all three, or split if a rank was late
        assert covered(done.stdout.splitlines(), line) == ranks, (line, done.stdout)
    assert secret not in done.stdout + done.stderr
    for path in record.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    on_nodes = [p for p in Path("/root/.orchestrator/runs/envs").rglob("*") if p.is_file()]
    assert {p.name for p in on_nodes} >= {"node0.sh", "rank-0.out", "rank-2.out"}
    for path in on_nodes:  # the nodes' copies of the scripts, the ranks' raw output
        assert secret not in path.read_text(errors="replace"), path
    plain = cli(
        cluster,
        workdir,
        *launch_args(
            workdir, hostfile, "noenv", "--no-forward-env", "--", "env_report.py", "NCCL_DEBUG"
        ),
        env={"NCCL_DEBUG": "WARN"},
    )
    assert plain.returncode == 0
    unset = workdir / "runs" / "noenv" / "logs" / "rank-0.log"
    assert unset.read_text() == "NCCL_DEBUG=<unset>\n"


def test_sync_copies_the_code_to_every_node(cluster, workdir: Path) -> None:
    code = workdir / "project"
    (code / "data").mkdir(parents=True)
    (code / "data" / "numbers.txt").write_text("21\n")
    (code / "main.py").write_text(
        textwrap.dedent("""
        import os
        here = os.path.dirname(os.path.abspath(__file__))
        value = int(open(os.path.join("data", "numbers.txt")).read())
        print(f"ran {os.path.abspath(__file__)} in {os.getcwd()} value {value * 2}")
    """)
    )
    hostfile = cluster.write_hostfile(workdir / "hosts.txt")
    done = cli(
        cluster,
        workdir,
        *launch_args(
            workdir, hostfile, "synced", "--sync", str(code), "--keep-node-logs", "--", "main.py"
        ),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for rank, node in enumerate(cluster.nodes):
        copy = f"/root/.orchestrator/runs/synced/node{rank}/project"
        assert f"[{node.name} r{rank}] ran {copy}/main.py in {copy} value 42" in done.stdout
        assert Path(copy, "data", "numbers.txt").read_text() == "21\n"
    names = compress_hosts(node.name for node in cluster.nodes)  # one line for them all
    said = f"[orchestrator] {names}: synced 2 file(s) to each node's run folder ("
    assert done.stdout.count(said) == 1 and "synced 2 file(s)" not in done.stdout.replace(said, "")


def test_exec_runs_a_command_everywhere_with_a_summary(cluster, workdir: Path) -> None:
    hostfile = cluster.write_hostfile(workdir / "hosts.txt")
    done = cli(
        cluster,
        workdir,
        "exec",
        str(hostfile),
        "--color",
        "never",
        "--",
        "ip -4 -o addr show eth0 | awk '{print $4}'",
    )
    assert done.returncode == 0, done.stderr
    for node in cluster.nodes:
        assert f"[{node.name}] {node.cidr}" in done.stdout
        assert re.search(rf"^{node.name}\s+ok$", done.stdout, re.M)
    odd = cluster.nodes[1].address
    failing = cli(
        cluster,
        workdir,
        "exec",
        str(hostfile),
        "--color",
        "never",
        "--",
        f"ip -4 -o addr show eth0 | grep -q {odd}/ && exit 4 || echo fine",
    )
    assert failing.returncode == 1
    assert re.search(rf"^{cluster.nodes[1].name}\s+exit code 4$", failing.stdout, re.M)
    assert "2 of 3 node(s) succeeded" in failing.stdout


ALIKE = textwrap.dedent("""
    import os
    rank = int(os.environ["RANK"])
    print("loading shards", flush=True)
    if rank == 4:
        print("rank 4 has a line of its own", flush=True)
    print(f"rank {rank} done", flush=True)
""")


def covered(lines: list[str], text: str) -> list[str]:
    """The sources ('ceon2 r3', or 'ceon2' for a node's line) of the console lines that
    show `text`, folded ones expanded."""
    sources = []
    for line in lines:
        match = re.fullmatch(r"\[(\S+?)(?: (r\S+))?\] " + re.escape(text), line)
        if match is None:
            continue
        hosts, ranks = match.groups()
        names = expand_range(hosts)
        if ranks is None:
            sources += names
        else:
            numbers = [int(r[1:]) for r in expand_range(ranks)]
            sources += [f"r{n}" for n in numbers]
    return sorted(sources)


def test_lines_every_rank_prints_alike_show_once(cluster, workdir: Path) -> None:
    (workdir / "alike.py").write_text(ALIKE)
    hostfile = cluster.write_hostfile(workdir / "hosts.txt", slots=2)
    done = cli(cluster, workdir, *launch_args(workdir, hostfile, "alike", "--", "alike.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # the six ranks start together: one line (two if a rank is late) names all of them
    shards = [line for line in lines if line.endswith("] loading shards")]
    assert 1 <= len(shards) <= 2, done.stdout
    assert covered(lines, "loading shards") == sorted(f"r{r}" for r in range(6)), done.stdout
    assert f"[{cluster.nodes[2].name} r4] rank 4 has a line of its own" in lines
    for rank in range(6):
        assert f"[{cluster.nodes[rank // 2].name} r{rank}] rank {rank} done" in lines
    logs = workdir / "runs" / "alike" / "logs"
    for rank in range(6):  # the run record keeps every line
        own = "rank 4 has a line of its own\n" if rank == 4 else ""
        text = f"loading shards\n{own}rank {rank} done\n"
        assert (logs / f"rank-{rank}.log").read_text() == text
    runs = ["--run-dir", str(workdir / "runs")]
    folded = cli(cluster, workdir, "logs", "alike", *runs)
    assert covered(folded.stdout.splitlines(), "loading shards") == [f"r{r}" for r in range(6)]
    assert len([x for x in folded.stdout.splitlines() if x.endswith("loading shards")]) == 1
    raw = cli(cluster, workdir, "logs", "alike", "--no-fold", *runs)
    assert raw.stdout == (logs / "combined.log").read_text()
    assert raw.stdout.count("] loading shards\n") == 6
    unfolded = cli(
        cluster, workdir, *launch_args(workdir, hostfile, "raw", "--no-fold", "--", "alike.py")
    )
    assert unfolded.returncode == 0, unfolded.stdout + unfolded.stderr
    for rank in range(6):
        node = cluster.nodes[rank // 2].name
        assert f"[{node} r{rank}] loading shards\n" in unfolded.stdout
    same = cli(
        cluster, workdir, "exec", str(hostfile), "--color", "never", "--", "echo same; hostname -I"
    )
    assert same.returncode == 0, same.stdout + same.stderr
    shown = same.stdout.splitlines()
    assert covered(shown, "same") == sorted(node.name for node in cluster.nodes), same.stdout
    for node in cluster.nodes:
        assert any(line.startswith(f"[{node.name}] {node.address}") for line in shown), shown


def test_ssh_config_alias_and_proxy_jump_are_honoured(cluster, workdir: Path) -> None:
    jump, direct, hidden = cluster.nodes
    config = cluster.ssh.default_config(cluster.nodes, "10.177.*") + textwrap.dedent(f"""
        Host gpu-direct
            HostName {direct.address}
            User root
            IdentityFile {cluster.ssh.key_path}
        Host gpu-hidden
            HostName {hidden.address}
            User root
            IdentityFile {cluster.ssh.key_path}
            ProxyJump {jump.name}
    """)
    cluster.write_ssh_config(config)
    hostfile = workdir / "aliases.txt"
    hostfile.write_text("gpu-direct\ngpu-hidden\n")
    try:
        with cluster.blocked(None, hidden, port=22):
            done = cli(
                cluster,
                workdir,
                "exec",
                str(hostfile),
                "--color",
                "never",
                "--connect-timeout",
                "5",
                "--",
                "ip -4 -o addr show eth0",
            )
            assert done.returncode == 0, done.stdout + done.stderr
            assert f"[gpu-hidden] 2: eth0    inet {hidden.cidr}" in done.stdout, done.stdout
            assert f"[gpu-direct] 2: eth0    inet {direct.cidr}" in done.stdout
            unjumped = workdir / "direct.txt"
            unjumped.write_text(f"{hidden.name}\n")
            blocked = cli(
                cluster, workdir, "exec", str(unjumped), "--connect-timeout", "3", "--", "true"
            )
            assert blocked.returncode == 1, "the block must be real for the test to mean anything"
    finally:
        cluster.write_ssh_config()


def test_default_key_and_ssh_agent_work_without_any_config(
    cluster, workdir: Path, tmp_path: Path
) -> None:
    hostfile = cluster.write_hostfile(workdir / "hosts.txt")
    bare = ["--ssh-config", str(tmp_path / "no-such-config")]
    # ~/.ssh/id_ed25519 is found as ssh finds it: no config, no -i.
    by_default_key = cli(cluster, workdir, "exec", str(hostfile), *bare, "--", "true")
    assert by_default_key.returncode == 0, by_default_key.stderr

    # A home with no key at all: only an ssh-agent holding it lets us in.
    home = tmp_path / "agent-home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text((cluster.home / ".ssh" / "known_hosts").read_text())
    socket_path = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL)
    try:
        wait_until(socket_path.exists, 10, "the ssh-agent socket")
        env = {**cluster.environ(), "HOME": str(home), "SSH_AUTH_SOCK": str(socket_path)}
        without_agent = run_cli(
            ["exec", str(hostfile), *bare, "--", "true"],
            cwd=workdir,
            env={k: v for k, v in env.items() if k != "SSH_AUTH_SOCK"},
        )
        assert without_agent.returncode == 2, "no key and no agent must not get in"
        assert "authentication failed" in without_agent.stderr
        added = subprocess.run(
            ["ssh-add", str(cluster.ssh.key_path)], env=env, capture_output=True, text=True
        )
        assert added.returncode == 0, added.stderr
        with_agent = run_cli(["exec", str(hostfile), *bare, "--", "true"], cwd=workdir, env=env)
        assert with_agent.returncode == 0, with_agent.stderr
    finally:
        agent.terminate()
        agent.wait()
