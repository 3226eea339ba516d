"""The commands that look after the nodes rather than run a job: `check` and `clean`.

`check_nodes` proves a hostfile's nodes ready for a job (check/run.py prints its report on
`out` and returns 0 only when everything passed); `clean_nodes` removes the nodes' copies
of ended runs and returns the table of what it found. Both take the command line's
options by keyword, checked here once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from orchestrator.api.keywords import refuse_empty, select, ssh_keywords
from orchestrator.backends import close_all, connect_cluster
from orchestrator.check.inputs import CheckOptions, check_json_path, parse_max_size
from orchestrator.check.run import run_check
from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import load_hostfile
from orchestrator.hosts.selection import Selection
from orchestrator.nodes.clean import clean_nodes as clean_on_nodes
from orchestrator.nodes.clean import clean_table, parse_age
from orchestrator.plan.container import job_container
from orchestrator.plan.spec import parse_master_port
from orchestrator.record.runs import check_run_id, new_run_id, refuse_existing


def check_nodes(
    hostfile: str | Path,
    *,
    nproc_per_node: int | None = None,
    master_addr: str | None = None,
    master_port: str = "auto",
    ifname: str | None = None,
    python: str | None = None,
    backend: str = "auto",
    max_size: str | None = None,
    skip_bandwidth: bool = False,
    json_path: str | None = None,
    timeout: float = 180.0,
    run_id: str | None = None,
    run_dir: str = "runs",
    include: str | None = None,
    exclude: str | None = None,
    num_nodes: int | None = None,
    num_gpus: int | None = None,
    bad_nodes: str | None = None,
    container: str | None = None,
    container_runtime: str | None = None,
    container_mounts: str | None = None,
    container_workdir: str | None = None,
    container_args: tuple[str, ...] = (),
    container_python: str | None = None,
    argv: tuple[str, ...] = ("orchestrator.check_nodes",),
    out: TextIO | None = None,
    say=lambda text: None,
    **ssh,
) -> int:
    """`orchestrator check`: the report on `out` (stdout by default); 0 when all passed.
    With `container`, the facts and the collectives job are taken inside that image."""
    size = parse_max_size(max_size) if max_size is not None else None
    refuse_empty(ifname=ifname, python=python)
    if json_path is not None:
        check_json_path(json_path)
    selection = Selection(include, exclude, num_nodes, num_gpus, bad_nodes)
    cluster = select(load_hostfile(str(hostfile)), selection, nproc_per_node, say)
    assert cluster is not None
    options = CheckOptions(
        run_dir=run_dir,
        run_id=check_run_id(run_id) if run_id else new_run_id(),
        argv=argv,
        python=python or sys.executable,
        nproc_per_node=nproc_per_node,
        master_addr=master_addr,
        master_port=parse_master_port(master_port),
        ifname=ifname,
        backend=backend,
        max_size=size,
        skip_bandwidth=skip_bandwidth,
        timeout=timeout,
        json_path=json_path,
        ssh=ssh_keywords("check", ssh),
        container=job_container(
            cluster.container,
            cluster.container_source,
            "ssh",
            image=container,
            runtime=container_runtime,
            mounts=container_mounts,
            workdir=container_workdir,
            args=tuple(container_args),
            python=container_python,
        ),  # fmt: skip
    )
    refuse_existing(run_dir, options.run_id)
    return run_check(cluster, options, out)


def clean_nodes(
    hostfile: str | Path,
    *,
    older_than: str = "0",
    dry_run: bool = False,
    python: str | None = None,
    **ssh,
) -> tuple[str, bool]:
    """`orchestrator clean`: (the table of the runs found and removed, whether every node
    could be cleaned)."""
    refuse_empty(python=python)
    try:
        age = parse_age(older_than)
    except ValueError as exc:
        raise ConfigError(f"--older-than: {exc}") from None
    cluster = load_hostfile(str(hostfile))
    connections = connect_cluster(cluster, ssh_keywords("clean", ssh))
    try:
        pythons = [host.python or python or sys.executable for host in cluster.hosts]
        found, failed = clean_on_nodes(connections, pythons, age, dry_run)
    finally:
        close_all(connections)
    return clean_table(found, failed, dry_run), not failed
