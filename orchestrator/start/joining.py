"""--min-nodes growing back, the node pool's side: a host asked again (start/regrow.py) that
answers and passes its probe joins at the next attempt while the run is on fewer nodes than
the launch chose, or is held as a spare when it is not (so the next node lost is replaced).
At that attempt the hosts joining are probed again with the master; one that fails goes
back among the hosts asked again, in one line saying why, and the run goes on without it."""

from __future__ import annotations

from orchestrator.backends import close_all
from orchestrator.errors import NodeErrors
from orchestrator.start.pool import Member, NodePool, Probe


def room(pool: NodePool) -> int:
    """How many more nodes the run can take: the hosts the launch chose, less those it
    runs on and those already joining."""
    return pool.most - len(pool.active) - len(pool.back)


def take(pool: NodePool, member: Member, joins: bool) -> None:
    """A host asked again answered and passed its probe (`member`: with its connection):
    it joins at the next attempt, or it is held as a spare."""
    pool.gone = [m for m in pool.gone if m.host.name != member.host.name]
    pool.every_connection.append(member.connection)
    if joins:
        pool.back.append(member)
    else:
        hold(pool, member)


def hold(pool: NodePool, member: Member) -> None:
    """`member` becomes a spare of the pool, as one of --spares N would be."""
    pool.spares.append(member)
    pool.spare_count += 1


def grow(pool: NodePool, probe: Probe | None, new_attempt: bool = True) -> None:
    """The hosts that answered again join, after the others (the master stays), never more
    than the launch chose (one beyond that is held as a spare); they and the master are
    probed. A survivor that fails its probe ends the run (NodeErrors), as after a shrink."""
    joining = pool.back[: max(0, pool.most - len(pool.active))]
    for member in pool.back[len(joining) :]:
        hold(pool, member)
    pool.back = []
    if not joining:
        return
    pool.attempt += 1 if new_attempt else 0
    first = len(pool.active)
    pool.active += joining
    failed = probe_joining(pool, probe, first) if probe is not None else {}
    joined = ", ".join(m.host.name for m in joining if m.host.name not in failed)
    said = [f"{joined} back"] if joined else []
    said += [f"{name} back but failed the preflight ({why})" for name, why in failed.items()]
    pool.change = f"{'; '.join(said)}: {len(pool.active)} of {pool.most} nodes"


def probe_joining(pool: NodePool, probe: Probe, first: int) -> dict[str, str]:
    """Probe the master (a fresh port) and the nodes joining from node rank `first` on;
    one that fails goes back among the hosts asked again. Host -> why, for those."""
    result = pool.probe_ranks(probe, sorted({0, *range(first, len(pool.active))}))
    if any(index < first for index in result.failed):
        raise NodeErrors([result.failed[i] for i in sorted(result.failed)], "preflight")
    failed = [pool.active[index] for index in sorted(result.failed)]
    why = {}
    for index, member in zip(sorted(result.failed), failed, strict=True):
        why[member.host.name] = result.failed[index].message
        pool.active = [m for m in pool.active if m is not member]
        close_all([member.connection])  # it is asked again on a connection of its own
        pool.gone.append(Member(member.host, None))
        pool.note(
            f"{member.host.name} back but failed the preflight ({why[member.host.name]}); "
            f"going on with {len(pool.active)} of {pool.most} nodes, asking it again later"
        )
    return why
