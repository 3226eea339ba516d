"""The bad-node list (--bad-nodes FILE): hosts that a node fault took out of a run, skipped
by later launches and checks, as SLURM's --exclude would. Pure, but for reading and
appending the file.

One host a line, with when, which run and why after a `#`:

    ceon2  # 2026-11-25T10:02:13Z run r7: lost: its agent ended without reporting

A person removes a line to use the host again; lines they add by hand count the same.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

from orchestrator.errors import ConfigError, SourceError
from orchestrator.hosts.hostfile import Cluster
from orchestrator.record.runs import now_iso

HEADER = (
    "# orchestrator's bad-node list: the hosts here are skipped by `orchestrator launch` and\n"
    "# `orchestrator check` given --bad-nodes with this file. A run adds a host when a node\n"
    "# fault took it out (--spares); remove its line to use the host again.\n"
)
_HOST = re.compile(r"[A-Za-z0-9_.:\[\]%-]+")


def read_bad_nodes(path: str) -> dict[str, str]:
    """Host -> its note ('' when none); a missing file is an empty list."""
    try:
        with open(path, encoding="utf-8-sig") as handle:
            text = handle.read()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--bad-nodes {path}: cannot read it: {exc}") from None
    found: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        entry, _, note = line.partition("#")
        entry = entry.strip()
        if not entry:
            continue
        if not _HOST.fullmatch(entry):
            raise SourceError(
                path, lineno, f"{entry!r} is not a host name (one host a line, notes after #)"
            )
        found[entry] = note.strip()
    return found


def add_bad_node(path: str, host: str, run_id: str, why: str, when: float | None = None) -> None:
    """Append `host` with when, which run and why (the file is created with its header)."""
    new = not os.path.exists(path)
    reason = " ".join(why.split())  # one line, whatever the reason held
    with open(path, "a", encoding="utf-8") as handle:
        if new:
            handle.write(HEADER)
        handle.write(f"{host}  # {now_iso(when)} run {run_id}: {reason}\n")


def skip_bad_nodes(cluster: Cluster, path: str | None) -> tuple[Cluster, list[str]]:
    """The cluster without the hosts the list names, and the names it dropped."""
    if not path:
        return cluster, []
    bad = read_bad_nodes(path)
    kept = tuple(host for host in cluster.hosts if host.name not in bad)
    dropped = [host.name for host in cluster.hosts if host.name in bad]
    if not kept:
        raise ConfigError(
            f"every host of {cluster.path} is in the bad-node list {path}; remove the lines "
            "of the hosts that are healthy again"
        )
    return replace(cluster, hosts=kept), dropped
