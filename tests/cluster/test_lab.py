"""Self-tests of the lab: the namespace cluster, sshd, faults, SLURM, teardown — all real.
(Its parts that need no cluster are in tests/unit/lab/test_lab_parts.py.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from functools import partial
from pathlib import Path

import paramiko
import pytest

from tests import factories
from tests.lab import pages, state
from tests.lab.cluster import Cluster, Node
from tests.lab.faults import Proc
from tests.lab.slurm import SlurmCluster
from tests.lab.ssh import connect, wrong_host_key

REPO = Path(__file__).resolve().parents[2]


def tcp_reachable(address: str, port: int = 22, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


# What the lab does happens at once or not at all: 5 s are plenty.
wait_for = partial(factories.wait_for, timeout=5.0)


# ----- nodes, names, ssh -----------------------------------------------------------------------


@pytest.mark.cluster
def test_each_node_has_its_own_address_on_eth0_over_paramiko(cluster: Cluster) -> None:
    assert len({n.host_public_key for n in cluster.nodes}) == len(cluster.nodes)
    for node in cluster.nodes:
        status, out, err = cluster.ssh_run(node, "ip -4 -o addr show dev eth0")
        assert status == 0, err
        assert f"inet {node.cidr}" in out
        others = [n.address for n in cluster.nodes if n is not node]
        assert not any(f"inet {a}/" in out for a in others)


@pytest.mark.cluster
def test_names_resolve_on_controller_and_nodes(cluster: Cluster) -> None:
    for node in cluster.nodes:
        assert socket.gethostbyname(node.name) == node.address
    last = cluster.nodes[-1]
    done = cluster.exec_in(cluster.nodes[0], ["getent", "hosts", last.name])
    assert done.stdout.split()[0] == last.address


@pytest.mark.cluster
def test_wrong_or_missing_host_key_is_rejected_by_paramiko(
    cluster: Cluster, tmp_path: Path
) -> None:
    node, other = cluster.nodes[0], cluster.nodes[1]
    changed = cluster.write_known_hosts(
        changed={node.name: wrong_host_key()}, path=tmp_path / "changed"
    )
    with pytest.raises(paramiko.BadHostKeyException):
        connect(node, cluster.ssh.key_path, changed)
    client = connect(other, cluster.ssh.key_path, changed)  # its real key is still listed
    client.close()
    unknown = cluster.write_known_hosts([other], path=tmp_path / "unknown")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect(node, cluster.ssh.key_path, unknown)


@pytest.mark.cluster
def test_home_dir_serves_paramiko_defaults_and_openssh_config(cluster: Cluster) -> None:
    ssh_dir = cluster.home / ".ssh"
    assert {p.name for p in ssh_dir.iterdir()} >= {
        "id_ed25519", "id_ed25519.pub", "config", "known_hosts"
    }  # fmt: skip
    node = cluster.nodes[1]
    done = subprocess.run(
        cluster.ssh_argv(node, "ip -4 -o addr show dev eth0"),
        capture_output=True, text=True, timeout=30, env=cluster.environ(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert node.address in done.stdout
    # paramiko as the CLI would use it: HOME decides ~/.ssh/known_hosts and the default key.
    code = (
        "import os, paramiko; c = paramiko.SSHClient(); c.load_system_host_keys("
        "os.path.expanduser('~/.ssh/known_hosts')); c.set_missing_host_key_policy("
        f"paramiko.RejectPolicy()); c.connect({node.name!r}, username='root', allow_agent=False);"
        " print(c.exec_command('echo ok')[1].read().decode().strip())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cluster.environ()
    )
    assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.cluster
def test_hostfile_lists_chosen_nodes(cluster: Cluster, tmp_path: Path) -> None:
    path = cluster.write_hostfile(tmp_path / "hosts", [0, 2], slots=2)
    names = [cluster.nodes[0].name, cluster.nodes[2].name]
    assert path.read_text() == "".join(f"{n} slots=2\n" for n in names)


@pytest.mark.cluster
@pytest.mark.slow
def test_torchrun_gloo_all_reduce_across_two_nodes(cluster: Cluster) -> None:
    script = cluster.workdir / "allreduce.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch, torch.distributed as dist
            dist.init_process_group("gloo")
            t = torch.tensor([float(dist.get_rank())])
            dist.all_reduce(t)
            print(f"rank={dist.get_rank()} world={dist.get_world_size()} sum={int(t.item())}")
            dist.destroy_process_group()
            """
        )
    )
    master: Node = cluster.nodes[0]
    results: dict[int, tuple[int, str, str]] = {}

    def run(rank: int) -> None:
        command = (
            f"cd {cluster.workdir} && GLOO_SOCKET_IFNAME=eth0 {sys.executable} -m "
            f"torch.distributed.run --nnodes=2 --nproc_per_node=1 --node_rank={rank} "
            f"--master_addr={master.address} --master_port=29511 {script}"
        )
        results[rank] = cluster.ssh_run(cluster.nodes[rank], command, timeout=150)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    for rank in (0, 1):
        status, out, err = results[rank]
        assert status == 0, err[-2000:]
        assert f"rank={rank} world=2 sum=1" in out


# ----- faults and inspection -------------------------------------------------------------------


@pytest.mark.cluster
def test_link_cut_makes_node_unreachable_and_restore_brings_it_back(cluster: Cluster) -> None:
    node = cluster.nodes[2]
    assert tcp_reachable(node.address)
    with cluster.link_cut(node):
        assert not tcp_reachable(node.address)
        probe = f"exec 3<>/dev/tcp/{node.address}/22"
        peer = cluster.exec_in(cluster.nodes[0], ["timeout", "1", "bash", "-c", probe])
        assert peer.returncode != 0
    assert wait_for(lambda: tcp_reachable(node.address))
    assert cluster.ssh_run(node, "true")[0] == 0


@pytest.mark.cluster
def test_block_port_rejects_and_drop_times_out(cluster: Cluster) -> None:
    src, dst, control = cluster.nodes[0], cluster.nodes[1], cluster.nodes[2]
    probe = "import socket,sys; socket.create_connection((sys.argv[1], 22), timeout=1); print('ok')"

    def connects(from_node: Node, to: Node) -> subprocess.CompletedProcess[str]:
        return cluster.exec_in(from_node, [sys.executable, "-c", probe, to.address], timeout=20)

    with cluster.blocked(src, dst, port=22):
        refused = connects(src, dst)
        assert refused.returncode != 0 and "PermissionError" in refused.stderr
        assert connects(src, control).stdout.strip() == "ok"
        assert connects(control, dst).stdout.strip() == "ok"
    assert connects(src, dst).stdout.strip() == "ok"
    with cluster.blocked(None, dst, mode="drop"):
        started = time.monotonic()
        assert not tcp_reachable(dst.address, timeout=1.0)
        assert time.monotonic() - started >= 0.9  # silently dropped: a timeout, not a refusal
        assert tcp_reachable(control.address)
    with cluster.blocked(None, dst, port=22, mode="unreachable"):
        assert not tcp_reachable(dst.address)
    assert tcp_reachable(dst.address)


@pytest.mark.cluster
def test_killed_sshd_refuses_and_restarts_with_the_same_host_key(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    client = connect(node, cluster.ssh.key_path, cluster.ssh.known_hosts_path)
    try:
        killed = cluster.kill_sshd(node, sessions=True)
        assert len(killed) >= 2  # the listener and this connection's session process
        assert not tcp_reachable(node.address)
        assert wait_for(lambda: not client.get_transport().is_active())  # type: ignore[union-attr]
    finally:
        client.close()
    cluster.start_sshd(node)
    assert cluster.ssh_run(node, "true")[0] == 0


@pytest.mark.cluster
def test_processes_on_sees_a_process_only_on_its_node(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    token = uuid.uuid4().hex
    sleeper = cluster.popen_in(node, ["sleep", "60"], env={**os.environ, "LAB_MARK": token})
    try:

        def seen() -> list[Proc]:
            # Until `ip netns exec` has exec'd, the pid is already in the namespace as `ip`.
            procs = cluster.processes_on(node)
            return [p for p in procs if p.pid == sleeper.pid and p.cmdline == ("sleep", "60")]

        assert wait_for(lambda: bool(seen()))
        found = seen()[0]
        assert found.node == node.name and found.exe == "/usr/bin/sleep"
        assert found.environ()["LAB_MARK"] == token
        for other in cluster.nodes:
            if other is not node:
                assert sleeper.pid not in [p.pid for p in cluster.processes_on(other)]
        assert cluster.pids_with_env("LAB_MARK", token) == [sleeper.pid]
        assert cluster.pids_with_env("LAB_MARK", "other") == []
        lab = cluster.processes_on(node, include_lab=True)
        assert cluster.sshd_pid(node) in [p.pid for p in lab]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert cluster.pids_with_env("LAB_MARK", token) == []


@pytest.mark.cluster
def test_processes_started_over_ssh_are_found_by_env(cluster: Cluster) -> None:
    run_id = uuid.uuid4().hex[:12]
    node = cluster.nodes[2]
    command = f"ORCHESTRATOR_RUN_ID={run_id} setsid sleep 60 >/dev/null 2>&1 < /dev/null &"
    assert cluster.ssh_run(node, command)[0] == 0
    expected = [(node.name, ("sleep", "60"))]

    def found() -> list[Proc]:
        return cluster.processes_with_env("ORCHESTRATOR_RUN_ID", run_id)

    # ssh returns once the shell has forked; `setsid` may not have exec'd `sleep` yet.
    assert wait_for(lambda: [(p.node, p.cmdline) for p in found()] == expected)
    os.kill(found()[0].pid, 9)
    assert wait_for(lambda: not cluster.pids_with_env("ORCHESTRATOR_RUN_ID", run_id))


# ----- several clusters, stale clusters, teardown ----------------------------------------------


@pytest.mark.cluster
def test_second_cluster_gets_its_own_subnet_and_teardown_leaves_nothing(
    cluster: Cluster, make_cluster
) -> None:  # type: ignore[no-untyped-def]
    with pytest.warns(UserWarning, match="teardown killed.*sleep 300"), make_cluster(2) as extra:
        assert extra.name != cluster.name and not extra.subnet.overlaps(cluster.subnet)
        assert all(len(n.veth) <= 15 for n in extra.nodes) and len(extra.bridge) <= 15
        assert extra.ssh_run(1, "true")[0] == 0
        extra.popen_in(0, ["sleep", "300"], start_new_session=True)  # a stray to be killed
        extra.block(None, extra.nodes[1], port=22)  # a rule in the root namespace
    assert extra.residue() == []
    assert f"{extra.name}-node0" not in Path("/etc/hosts").read_text()
    assert cluster.ssh_run(0, "true")[0] == 0  # the session cluster is untouched


@pytest.mark.cluster
def test_confined_nodes_run_in_a_cgroup_apart_and_teardown_removes_it(make_cluster) -> None:  # type: ignore[no-untyped-def]
    with make_cluster(2) as lab:
        said = lab.confine(lab.nodes[1:])
        if lab.apart is None:
            pytest.skip(said)  # a machine without cgroup v1 hierarchies for memory and cpu
        assert said.startswith("1 nodes in a cgroup apart"), said
        groups = {Path(path).name for path in lab.state.cgroups}
        assert groups == {f"{lab.name}-nodes"}
        inside = lab.ssh_run(1, "cat /proc/self/cgroup")[1]
        outside = lab.ssh_run(0, "cat /proc/self/cgroup")[1]
        assert f"/{lab.name}-nodes" in inside, inside
        assert f"/{lab.name}-nodes" not in outside, outside
        lab.restart_sshd(1)  # a restarted sshd goes back in
        assert f"/{lab.name}-nodes" in lab.ssh_run(1, "cat /proc/self/cgroup")[1]
        if lab.apart.accounting is not None:  # the nodes' CPU is counted, the others' not
            busy = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"
            before = lab.apart.cpu_seconds()
            lab.ssh_run(1, busy)
            inside_cpu = lab.apart.cpu_seconds() - before
            lab.ssh_run(0, busy)
            outside_cpu = lab.apart.cpu_seconds() - before - inside_cpu
            assert inside_cpu > 0.3, inside_cpu
            assert outside_cpu < inside_cpu / 3, (inside_cpu, outside_cpu)
    assert lab.residue() == []
    assert not any(Path(path).exists() for path in lab.state.cgroups)


@pytest.mark.cluster
@pytest.mark.slow
def test_shared_pages_keep_one_torch_copy_even_paused_teardown_restores_ksmd(make_cluster) -> None:  # type: ignore[no-untyped-def]
    if not (pages.KSM / "run").exists():
        pytest.skip(f"this kernel has no same-page merging ({pages.KSM} is missing)")
    before = pages.running()
    with make_cluster(2, share_pages=True) as lab:
        assert lab.sharing.startswith("nodes share identical memory pages"), lab.sharing
        assert lab.state.ksm == (state.ksm_before(lab.name) or before)  # kept for teardown
        # What a session gets: ASLR off (personality 0x0040000), merging on, the hash seed.
        said = lab.ssh_run(
            1,
            "cat /proc/self/personality; grep merge_any /proc/self/ksm_stat; "
            "python3 -c \"import os; print(os.environ['PYTHONHASHSEED'])\"",
        )[1].split()
        assert said == ["00040000", "ksm_merge_any:", "yes", "0"], said
        start = pages.merged_bytes()
        hold = f"{sys.executable} -c 'import sys, torch; sys.stdin.read()'"  # until EOF
        sessions = [subprocess.Popen(lab.ssh_argv(i, hold), stdin=subprocess.PIPE) for i in (0, 1)]
        try:
            deadline = time.monotonic() + 80
            while pages.merged_bytes() - start < 50 << 20 and time.monotonic() < deadline:
                time.sleep(1)
            # Two torch imports: ~144 MB each of their own without merging.
            assert pages.merged_bytes() - start >= 50 << 20, pages.merged_bytes() - start
            with pages.paused() as stopped:  # ksmd stops scanning; what it merged stays
                assert stopped and pages.running()["run"] == "0"
                assert pages.merged_bytes() - start >= 50 << 20, pages.merged_bytes() - start
            assert pages.running()["run"] == "1"
        finally:
            for session in sessions:
                session.communicate(timeout=30)
    assert pages.running() == before
    assert lab.residue() == []


@pytest.mark.cluster
def test_stale_cluster_of_a_dead_process_is_removed() -> None:
    # The child prints its record and dies without teardown (another session running
    # remove_stale() concurrently may clean it up first, which is fine).
    code = (
        "import dataclasses, json, os; from tests.lab.cluster import Cluster; "
        "c = Cluster.create(2); print(json.dumps([dataclasses.asdict(c.state), "
        "c.netns_inodes]), flush=True); os._exit(0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    fields, inodes = json.loads(done.stdout)
    record = state.ClusterState(**fields)
    assert not record.owner_alive() and len(record.pids) == 2
    state.remove_stale()
    assert state.residue(record, inodes) == []


# ----- SLURM ------------------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.slurm
def test_sbatch_two_nodes_runs_on_both_and_reports_exit_codes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    nodes = slurm_cluster.nodes[:2]
    script = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --output=%j.out\nsrun ip -4 -o a show eth0\n"
    job = slurm_cluster.sbatch(script, cwd=tmp_path)
    info = slurm_cluster.wait_job(job, timeout=60)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0")
    out = (tmp_path / f"{job}.out").read_text()
    assert all(f"inet {n.cidr}" in out for n in nodes), out

    failing = slurm_cluster.sbatch(
        "#!/bin/bash\n#SBATCH --nodes=2\nsrun true\nexit 3\n", cwd=tmp_path
    )
    info = slurm_cluster.wait_job(failing, timeout=60)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "3:0")
    records = {r["JobId"]: r for r in slurm_cluster.jobcomp_records()}
    assert records[str(job)]["ExitCode"] == "0:0"
    failed = records[str(failing)]
    assert (failed["JobState"], failed["ExitCode"]) == ("FAILED", "3:0")
    squeue = slurm_cluster.run(["squeue", "-h", "-j", f"{job},{failing}"])
    assert squeue.stdout.strip() == ""
