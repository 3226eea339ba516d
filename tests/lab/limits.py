"""Per-user kernel limits that many nodes on one machine meet, where one node each would not.

Every node agent of a run watches its node directory for the ranks' writes with one inotify
instance (orchestrator.agent.wakeup), and the kernel allows a user 128 of them by default
(`fs.inotify.max_user_instances`). On a cluster each node has its own; in the lab all nodes
log in as one user on one kernel, so from about a hundred nodes on, the agents past the
limit would fall back to polling their rank files. A cluster that needs more raises the
limit while it is up (`raise_for`) and its teardown, or a later stale-cluster sweep, puts
back what it found (`restore`), as with ksmd's settings (pages.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
# Two per node (a test may run two jobs on the same nodes at once), and some for the rest of
# the machine (systemd, editors, test runners): a cluster of up to 32 nodes leaves 128 alone.
SPARE_INSTANCES = 64


def needed(nodes: int) -> int:
    return 2 * nodes + SPARE_INSTANCES


def current() -> int | None:
    try:
        return int(INOTIFY_INSTANCES.read_text())
    except (OSError, ValueError):
        return None


def raise_for(nodes: int) -> int | None:
    """Raise the instance limit for `nodes` nodes where it is lower; returns the value it
    had (for `restore`), or None where nothing was changed (high enough, or not writable)."""
    found = current()
    if found is None or found >= needed(nodes):
        return None
    try:
        INOTIFY_INSTANCES.write_text(f"{needed(nodes)}\n")
    except OSError:
        return None  # the agents past the limit poll: slower, still correct
    return found


def restore(previous: int) -> None:
    with contextlib.suppress(OSError):
        INOTIFY_INSTANCES.write_text(f"{previous}\n")
