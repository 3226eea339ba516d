"""Connecting to many hosts at once: in parallel, each host's failure named, and a count
as each is done (for the start's progress line)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from orchestrator.backends.ssh.connect import SshSession
from orchestrator.errors import NodeError, NodeErrors
from orchestrator.hosts.hostfile import Host
from orchestrator.options.reaching import SshOptions


def connect_all(hosts: Sequence[Host], options: SshOptions | None, on_done=None) -> list:
    """Connect to every host in parallel (local ones locally); raise `NodeErrors` naming
    every host that failed, after closing the others."""
    connections, errors = connect_each(hosts, options, on_done)
    if errors:
        for connection in connections:
            if connection is not None:
                connection.close()
        raise NodeErrors(list(errors.values()), "connecting")
    return connections


def connect_each(hosts: Sequence[Host], options: SshOptions | None, on_done=None) -> tuple:
    """Connect to every host in parallel: a connection (None if it failed) per host, the
    errors by index (--spares replaces those hosts), and `on_done(ok)` as each is done."""
    from orchestrator.backends.local import LocalConnection

    session = SshSession(options)

    def one(host: Host):
        return LocalConnection(host.name) if host.is_local else session.connect(host)

    with ThreadPoolExecutor(max_workers=min(64, max(1, len(hosts)))) as pool:
        futures = [pool.submit(one, host) for host in hosts]
        for future in futures if on_done else ():
            future.add_done_callback(lambda f: on_done(f.exception() is None))
    connections: list = []
    errors: dict[int, NodeError] = {}
    for index, (host, future) in enumerate(zip(hosts, futures, strict=True)):
        try:
            connections.append(future.result())
        except NodeError as exc:
            errors[index] = exc
        except Exception as exc:  # a bug or an unforeseen paramiko error: still name the host
            errors[index] = NodeError(host.name, f"cannot connect: {exc!r}")
        if index in errors:
            connections.append(None)
    session.report()
    return connections, errors
