"""Choosing hosts and slots out of a hostfile, as DeepSpeed's launcher does. Pure.

`--include "worker-0@worker-1:0,2"` uses every slot of worker-0 and slots 0 and 2 of
worker-1; `--exclude "worker-1:0"` uses everything but slot 0 of worker-1 (a host without
`:SLOTS` is included or excluded whole). `--num-nodes N` keeps the first N hosts,
`--num-gpus N` slots 0..N-1 on each. The grammar is DeepSpeed's (`NAME[:SLOT[,SLOT...]]`
joined by `@`); so are its two refusals: --include with --exclude, and either of them with
--num-nodes/--num-gpus. Hosts keep the hostfile's order (node_rank follows it); the chosen
slot ids become each node's CUDA_VISIBLE_DEVICES (orchestrator.plan.launch_plan), so LOCAL_RANK i is
the i-th chosen slot.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import Cluster, Host
from orchestrator.numerals import MAX_SLOTS, NumberError, shown, whole_number
from orchestrator.options.choosing import Selection


def slot_count(host: Host, nproc_per_node: int | None) -> int:
    """A host's slots: --nproc-per-node, else its `slots` (1 for a bare host), <= max_slots."""
    if nproc_per_node is not None:
        count, origin = nproc_per_node, "--nproc-per-node"
    else:
        count, origin = host.slots or 1, "slots"
    if host.max_slots is not None and count > host.max_slots:
        raise ConfigError(
            f"{host.source}: {origin} asks for {count} ranks on {host.name}, "
            f"but max_slots={host.max_slots}"
        )
    return count


def select_hosts(
    cluster: Cluster, selection: Selection, nproc_per_node: int | None = None
) -> Cluster:
    """The cluster the selection leaves: chosen hosts, each with its chosen `slot_ids`.

    Without a selection the cluster is returned as it is. Every contradiction is a
    ConfigError naming the flag (and the host).
    """
    if not selection.given:
        return cluster
    _check_flags(selection)
    available = {
        index: tuple(range(slot_count(host, nproc_per_node)))
        for index, host in enumerate(cluster.hosts)
    }
    if selection.include is not None:
        chosen = _filter(cluster, available, selection.include, "--include")
    elif selection.exclude is not None:
        chosen = _filter(cluster, available, selection.exclude, "--exclude")
    else:
        chosen = dict(available)
        if selection.num_nodes is not None:
            if selection.num_nodes > len(cluster.hosts):
                raise ConfigError(
                    f"--num-nodes {selection.num_nodes}: {cluster.path} lists "
                    f"only {len(cluster.hosts)} host(s)"
                )
            chosen = {i: chosen[i] for i in sorted(chosen)[: selection.num_nodes]}
        if selection.num_gpus is not None:
            for index in chosen:
                host = cluster.hosts[index]
                if selection.num_gpus > len(available[index]):
                    raise ConfigError(
                        f"--num-gpus {selection.num_gpus}: host {host.name} "
                        f"({host.source}) has {len(available[index])} slot(s)"
                    )
                chosen[index] = tuple(range(selection.num_gpus))
    if not chosen:
        flag = "--exclude" if selection.exclude is not None else "--include"
        raise ConfigError(
            f"{flag} {shown(_flag_value(selection))} leaves no slot on any host of "
            f"{cluster.path}; nothing to run"
        )
    hosts = tuple(
        replace(cluster.hosts[i], slots=len(ids), slot_ids=ids) for i, ids in sorted(chosen.items())
    )
    return replace(cluster, hosts=hosts, selection=selection.describe())


def _check_flags(selection: Selection) -> None:
    if selection.include is not None and selection.exclude is not None:
        raise ConfigError(
            "--include and --exclude together: give one of them (as with "
            "DeepSpeed, they are mutually exclusive)"
        )
    counted = selection.num_nodes is not None or selection.num_gpus is not None
    if counted and (selection.include is not None or selection.exclude is not None):
        flag = "--num-nodes" if selection.num_nodes is not None else "--num-gpus"
        other = "--include" if selection.include is not None else "--exclude"
        raise ConfigError(
            f"{flag} with {other}: choose hosts and slots one way (as with "
            "DeepSpeed, they are mutually exclusive)"
        )
    for flag, value in (("--num-nodes", selection.num_nodes), ("--num-gpus", selection.num_gpus)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {value}")


def _flag_value(selection: Selection) -> str:
    return selection.exclude if selection.exclude is not None else selection.include or ""


def _filter(
    cluster: Cluster, available: dict[int, tuple[int, ...]], text: str, flag: str
) -> dict[int, tuple[int, ...]]:
    """Apply DeepSpeed's `NAME[:SLOT,...]@...` to the available slots."""
    include = flag == "--include"
    chosen: dict[int, set[int]] = {} if include else {i: set(s) for i, s in available.items()}
    if not text.strip():
        raise ConfigError(f"{flag} is empty; give e.g. {flag} 'node1@node2:0,2'")
    for spec in text.split("@"):
        name, colon, slot_text = spec.partition(":")
        name = name.strip()
        indexes = [i for i, host in enumerate(cluster.hosts) if host.name == name]
        if not indexes:
            known = ", ".join(h.name for h in cluster.hosts[:8])
            more = ", ..." if len(cluster.hosts) > 8 else ""
            raise ConfigError(
                f"{flag} {shown(text)}: host {shown(name)} is not in {cluster.path} "
                f"(hosts: {known}{more})"
            )
        for index in indexes:
            host = cluster.hosts[index]
            slots = set(available[index])
            if colon:
                slots = _slot_ids(slot_text, flag, text, host, available[index])
            if include:
                chosen.setdefault(index, set()).update(slots)
            else:
                chosen[index] -= slots
    return {i: tuple(sorted(s)) for i, s in chosen.items() if s}


def _slot_ids(
    slot_text: str, flag: str, text: str, host: Host, available: tuple[int, ...]
) -> set[int]:
    ids = set()
    for item in slot_text.split(","):
        item = item.strip()
        try:
            slot = whole_number(item, "a slot id", 0, MAX_SLOTS - 1)
        except NumberError:
            raise ConfigError(
                f"{flag} {shown(text)}: slot {shown(item)} of host {host.name} is not a "
                f"slot id (0 to {MAX_SLOTS - 1}); write NAME:0,2"
            ) from None
        if slot not in available:
            raise ConfigError(
                f"{flag} {shown(text)}: host {host.name} has no slot {slot} (its "
                f"slots are 0-{len(available) - 1}; {host.source})"
            )
        ids.add(slot)
    return ids


def hold_spares(cluster: Cluster, count: int) -> Cluster:
    """--spares N: the last N hosts (after any selection) are held back to replace a node
    that fails; the run starts on the others."""
    if count < 0:
        raise ConfigError(f"--spares must be 0 or more, got {count}")
    if not count:
        return cluster
    if count >= len(cluster.hosts):
        raise ConfigError(
            f"--spares {count} leaves no host to run on: {len(cluster.hosts)} host(s) "
            f"chosen from {cluster.path}; the spares are the last {count} of them"
        )
    return replace(cluster, hosts=cluster.hosts[:-count], spares=cluster.hosts[-count:])


def check_min_nodes(min_nodes: int | None, count: int | None, where: str) -> None:
    """--min-nodes K: the floor a run may shrink to is at most the nodes it starts on
    (`count`, `where` saying where they come from)."""
    if min_nodes is not None and count is not None and min_nodes > count:
        raise ConfigError(
            f"--min-nodes {min_nodes} is more than the {count} node(s) the run starts on "
            f"({where}): the run could never go on with fewer; give --min-nodes {count} "
            "or less"
        )
