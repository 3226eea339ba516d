"""DeepSpeed habits end to end on the namespace cluster: real sshd, real torchrun.

A 3-host hostfile with slots=4; --include / --exclude / --num-nodes choose hosts and slot
ids, and every rank reports from inside itself: its node (by address: the lab's nodes share
one hostname), CUDA_VISIBLE_DEVICES and LOCAL_RANK, a variable of .deepspeed_env, a secret
of it (as a digest: the value itself is masked in every log), and its CPU affinity. The
ranks are tiny scripts without torch, so each launch costs about one torchrun start.
"""

from __future__ import annotations

import hashlib
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import assert_nothing_left, run_cli

pytestmark = pytest.mark.cluster

SECRET = "hf_cluster_s3cr3t"
RANK_REPORT = textwrap.dedent("""
    import hashlib, os, socket
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect((os.environ["MASTER_ADDR"], 9))  # no packet: picks the node's own address
    secret = os.environ.get("HF_TOKEN", "")
    print("REPORT", os.environ["RANK"], os.environ["LOCAL_RANK"], probe.getsockname()[0],
          os.environ.get("CUDA_VISIBLE_DEVICES", "-"), os.environ.get("DS_SITE", "-"),
          hashlib.sha256(secret.encode()).hexdigest()[:12],
          ",".join(map(str, sorted(os.sched_getaffinity(0)))), flush=True)
""")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "report.py").write_text(RANK_REPORT)
    return tmp_path


def launch(cluster, workdir: Path, run_id: str, *args: str, environ: dict | None = None):
    hostfile = cluster.write_hostfile(workdir / "hosts.txt", slots=4)
    done = run_cli(
        [
            "launch",
            str(hostfile),
            "--run-dir",
            str(workdir / "runs"),
            "--run-id",
            run_id,
            "--color",
            "never",
            *args,
            "--",
            "report.py",
        ],
        cwd=workdir,
        env=environ or cluster.environ(),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert_nothing_left(run_id)
    reports = {}
    for line in done.stdout.splitlines():
        match = re.match(r"^\[(\S+) r(\d+)\] REPORT (.*)$", line)
        if match:
            rank, local, address, cvd, site, digest, cpus = match.group(3).split()
            assert rank == match.group(2)
            reports[int(rank)] = {
                "node": match.group(1),
                "local": int(local),
                "address": address,
                "cvd": cvd,
                "site": site,
                "digest": digest,
                "cpus": set(map(int, cpus.split(","))),
            }
    return done, reports


def by_node(reports: dict) -> list[tuple[str, str, list[int]]]:
    """(address, CUDA_VISIBLE_DEVICES, local ranks) per node, in rank order."""
    nodes: dict[str, tuple[str, list[int]]] = {}
    for rank in sorted(reports):
        r = reports[rank]
        nodes.setdefault(r["address"], (r["cvd"], []))[1].append(r["local"])
    return [(address, cvd, locals_) for address, (cvd, locals_) in nodes.items()]


def assert_disjoint_per_node(reports: dict) -> None:
    for address in {r["address"] for r in reports.values()}:
        sets = [r["cpus"] for r in reports.values() if r["address"] == address]
        assert all(s for s in sets)
        assert sum(len(s) for s in sets) == len(set().union(*sets)), (address, sets)


def test_include_with_deepspeed_env_and_probed_core_binding(cluster, workdir: Path) -> None:
    n0, n1, n2 = cluster.nodes
    (workdir / ".deepspeed_env").write_text(f"DS_SITE=rack7\nHF_TOKEN={SECRET}\n")
    done, reports = launch(
        cluster,
        workdir,
        "habits-include",
        "--include",
        f"{n0.name}:1,3@{n2.name}:0,2",
        "--bind-cores",
    )
    assert by_node(reports) == [(n0.address, "1,3", [0, 1]), (n2.address, "0,2", [0, 1])]
    assert sorted(reports) == [0, 1, 2, 3]
    assert "env file" in done.stderr and ".deepspeed_env" in done.stderr
    digest = hashlib.sha256(SECRET.encode()).hexdigest()[:12]
    assert all(r["site"] == "rack7" and r["digest"] == digest for r in reports.values())
    assert_disjoint_per_node(reports)
    record = workdir / "runs" / "habits-include"
    plan = yaml.safe_load((record / "plan.yaml").read_text())
    assert plan["selection"] == f"--include {n0.name}:1,3@{n2.name}:0,2"
    for node, report in zip(plan["nodes"], (reports[0], reports[2]), strict=True):
        shown = node["cores"]["local rank 0"]  # probed: the plan shows the very sets
        assert shown.startswith(f"cores {min(report['cpus'])}")
    for path in record.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


def test_exclude_with_core_sets_computed_by_the_script(cluster, workdir: Path) -> None:
    n0, n1, n2 = cluster.nodes
    done, reports = launch(
        cluster,
        workdir,
        "habits-exclude",
        "--exclude",
        f"{n0.name}@{n1.name}:0,1@{n2.name}:1,2,3",
        "--bind_cores_to_rank",
        "--no-preflight",
        "--no-env-file",
    )
    assert by_node(reports) == [(n1.address, "2,3", [0, 1]), (n2.address, "0", [0])]
    assert all(r["site"] == "-" for r in reports.values())
    assert_disjoint_per_node(reports)
    assert "--bind-cores: core sets by local rank" in done.stdout


def test_num_nodes_takes_the_first_hosts_with_all_their_slots(cluster, workdir: Path) -> None:
    n0, n1, _ = cluster.nodes
    _, reports = launch(cluster, workdir, "habits-nodes", "--num_nodes", "2")
    assert by_node(reports) == [
        (n0.address, "0,1,2,3", [0, 1, 2, 3]),
        (n1.address, "0,1,2,3", [0, 1, 2, 3]),
    ]


@pytest.mark.slurm
def test_slurm_selection_is_a_node_list_with_each_nodes_ids(slurm_cluster, workdir: Path) -> None:
    """Under SLURM the chosen hosts become --nodelist, and each node (SLURM orders them its
    own way) sets its own slot ids; --bind-cores is computed on each node."""
    n0, n1, n2 = slurm_cluster.cluster.nodes
    done, reports = launch(
        slurm_cluster.cluster,
        workdir,
        "habits-slurm",
        "--backend",
        "slurm",
        "--partition",
        "debug",
        "--exclude",
        f"{n0.name}@{n1.name}:0,1@{n2.name}:0,3",
        "--bind-cores",
        environ=slurm_cluster.environ(),
    )
    assert sorted(by_node(reports)) == sorted(
        [(n1.address, "2,3", [0, 1]), (n2.address, "1,2", [0, 1])]
    )
    assert_disjoint_per_node(reports)
    sbatch = (workdir / "runs" / "habits-slurm" / "job.sbatch").read_text()
    assert f"#SBATCH --nodelist={n1.name},{n2.name}" in sbatch
