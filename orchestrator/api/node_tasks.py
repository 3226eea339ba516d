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

from orchestrator.api.request import select
from orchestrator.backends import close_all, connect_cluster
from orchestrator.check.inputs import CheckOptions, check_json_path, parse_max_size
from orchestrator.check.run import run_check
from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import load_hostfile
from orchestrator.nodes.clean import clean_nodes as clean_on_nodes
from orchestrator.nodes.clean import clean_table, parse_age
from orchestrator.options.checking import CollectiveOptions
from orchestrator.options.choosing import Selection
from orchestrator.options.declare import keywords_of
from orchestrator.options.image import ContainerOptions
from orchestrator.options.keywords import split_keywords
from orchestrator.options.reaching import SshOptions
from orchestrator.options.running import RunOptions
from orchestrator.options.workload import JobOptions
from orchestrator.plan.container import job_container
from orchestrator.record.runs import check_run_id, new_run_id, refuse_existing

# check's flags of the job's and the hosts' groups (it takes every container and SSH flag).
CHECK_JOB = ("nproc_per_node", "master_addr", "master_port", "ifname", "python")
CHECK_HOSTS = ("include", "exclude", "num_nodes", "num_gpus", "bad_nodes")
CHECK_GROUPS = {
    "job": JobOptions,
    "check": CollectiveOptions,
    "run": RunOptions,
    "hosts": Selection,
    "container": ContainerOptions,
    "ssh": SshOptions,
}
CHECK_KEYWORDS = (
    *CHECK_JOB,
    *CHECK_HOSTS,
    "run_id",
    "run_dir",
    *keywords_of(CollectiveOptions),
    *keywords_of(ContainerOptions),
    *keywords_of(SshOptions),
)


def check_nodes(
    hostfile: str | Path,
    *,
    argv: tuple[str, ...] = ("orchestrator.check_nodes",),
    out: TextIO | None = None,
    say=lambda text: None,
    **keywords,
) -> int:
    """`orchestrator check`: the report on `out` (stdout by default); 0 when all passed.
    `keywords`: check's flags. With `container`, the facts and the collectives job are taken
    inside that image."""
    parts = split_keywords("check", keywords, CHECK_GROUPS, CHECK_KEYWORDS)
    job, run = JobOptions(**parts["job"]), RunOptions(**parts["run"])
    collectives = CollectiveOptions(**parts["check"])
    size = parse_max_size(collectives.max_size) if collectives.max_size is not None else None
    if collectives.json_path is not None:
        check_json_path(collectives.json_path)
    selection = Selection(**parts["hosts"])
    cluster = select(load_hostfile(str(hostfile)), selection, job.nproc_per_node, say)
    assert cluster is not None
    options = CheckOptions(
        run_dir=run.run_dir,
        run_id=check_run_id(run.run_id) if run.run_id else new_run_id(),
        argv=argv,
        python=job.python or sys.executable,
        nproc_per_node=job.nproc_per_node,
        master_addr=job.master_addr,
        master_port=job.master_port,
        ifname=job.ifname,
        backend=collectives.backend,
        max_size=size,
        skip_bandwidth=collectives.skip_bandwidth,
        timeout=collectives.timeout,
        json_path=collectives.json_path,
        ssh=SshOptions(**parts["ssh"]),
        container=job_container(
            cluster.container,
            cluster.container_source,
            "ssh",
            ContainerOptions(**parts["container"]),
        ),
    )
    refuse_existing(run.run_dir, options.run_id)
    return run_check(cluster, options, out)


CLEAN_GROUPS = {"job": JobOptions, "ssh": SshOptions}
CLEAN_KEYWORDS = ("python", *keywords_of(SshOptions))


def clean_nodes(
    hostfile: str | Path,
    *,
    older_than: str = "0",
    dry_run: bool = False,
    **keywords,
) -> tuple[str, bool]:
    """`orchestrator clean`: (the table of the runs found and removed, whether every node
    could be cleaned). `keywords`: `python` and the ssh flags."""
    parts = split_keywords("clean", keywords, CLEAN_GROUPS, CLEAN_KEYWORDS)
    python = JobOptions(**parts["job"]).python
    try:
        age = parse_age(older_than)
    except ValueError as exc:
        raise ConfigError(f"--older-than: {exc}") from None
    cluster = load_hostfile(str(hostfile))
    connections = connect_cluster(cluster, SshOptions(**parts["ssh"]))
    try:
        pythons = [host.python or python or sys.executable for host in cluster.hosts]
        found, failed = clean_on_nodes(connections, pythons, age, dry_run)
    finally:
        close_all(connections)
    return clean_table(found, failed, dry_run), not failed
