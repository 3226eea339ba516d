"""Room for the descriptors a controller of many nodes holds.

Each node costs the controller a few descriptors: an SSH connection's socket and paramiko's
pipe for its channel (two), or a local agent's three pipes. Most systems give a process a
soft limit of 1 024 open files and a far higher hard one, which a process may raise its own
soft limit to: `ulimit -n` does the same. The soft limit is raised to what the node count
needs, never lowered and never past the hard limit.
"""

from __future__ import annotations

import resource

BASE_FILES = 256  # the controller's own: run record files, logs, the terminal, sockets
FILES_PER_NODE = 16  # well over what one node's connection and agent hold


def allow_open_files(nodes: int) -> int:
    """Raise this process's soft limit on open files for `nodes` nodes (as far as its hard
    limit allows); the soft limit it has now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = BASE_FILES + FILES_PER_NODE * nodes
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (OSError, ValueError):
            pass  # a sandbox that refuses: the limit stays, and a failed open says so
    return soft
