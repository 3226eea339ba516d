"""The node pool of every launch: the hosts a run uses in node-rank order, the spares held
back (--spares N), and what a node fault does to them.

A node fault (the node lost, its disk failing, a process there killed by SIGKILL or SIGBUS,
a preflight probe that fails on it) takes the node out: it goes on the bad-node list
(--bad-nodes), the next spare that passes its probe takes its node rank, and the launcher
starts the job again with the same program and world size. With no spare left (or none
held) and --min-nodes K, the run goes on with the survivors instead while at least K are
left: node ranks renumbered in order, the master moved with node 0, the world smaller (the
same at the start: hosts that cannot be reached or fail the preflight are left out). The
hosts left out are asked again while the run goes on (start/regrow.py) and join it again
(start/joining.py). A rank that fails by itself (an exception, exit 3) is the job's error
and never consumes a spare or shrinks the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from orchestrator.attempts.next_attempt import AttemptEnd, Next, next_attempt
from orchestrator.backends.base import NodeConnection
from orchestrator.errors import NodeError, NodeErrors
from orchestrator.hosts.hostfile import Cluster, Host
from orchestrator.nodes.probe import ProbeResult
from orchestrator.plan.launch_plan import LaunchPlan, NodeFacts
from orchestrator.record.bad_nodes import add_bad_node
from orchestrator.record.recoveries import Recovery
from orchestrator.record.world import AttemptWorld, fewer_nodes_line, floor_line, going_on_line
from orchestrator.supervise.state import NodeFault, Outcome

Probe = Callable[[Cluster, Sequence[NodeConnection], Sequence[int]], ProbeResult]


@dataclass
class Member:
    host: Host
    connection: NodeConnection  # None for a host not reached (yet): unreachable, or asked again
    facts: NodeFacts | None = None
    probed: tuple[float, float] | None = None  # its last probe: began, ended (wall clock)


class NodePool:
    """The run's hosts in node-rank order and its spares, each with its connection."""

    def __init__(
        self,
        cluster: Cluster,
        connections: Sequence[NodeConnection],
        run_id: str,
        bad_nodes: str | None = None,
        note: Callable[[str], None] = lambda text: None,
        min_nodes: int | None = None,
    ) -> None:
        count = len(cluster.hosts)
        self.base = cluster
        self.active = [
            Member(h, c) for h, c in zip(cluster.hosts, connections[:count], strict=True)
        ]
        self.spares = [
            Member(h, c) for h, c in zip(cluster.spares, connections[count:], strict=True)
        ]
        self.spare_count = len(self.spares)
        self.run_id = run_id
        self.bad_nodes = bad_nodes
        self.note = note
        self.recoveries: list[Recovery] = []
        self.attempt = 1
        self.every_connection = list(connections)  # to close at the end, lost ones too
        self.started, self.started_wall = time.monotonic(), time.time()
        self.carried: dict = {}
        self.min_nodes = min_nodes  # --min-nodes K: the fewest nodes the run goes on with
        # the hosts the launch chose, left out at the start or not: the most nodes the run
        # grows to (start/joining.py), and the N of the console's `3 of N nodes`
        self.most = count
        self.world: list[AttemptWorld] = []  # the nodes of each attempt (status.json `world`)
        self.launched_with: tuple[int, ...] | None = None  # each node's ranks at launch
        self.change = "launch"  # why the next attempt's world is what it is
        self.gone: list[Member] = []  # left out at the start or by a fault: asked if back
        self.back: list[Member] = []  # hosts that answered again: they join (start/joining.py)
        self.slow: set[str] = set()  # hosts taken out for being slow: never asked back

    @property
    def cluster(self) -> Cluster:
        return replace(
            self.base,
            hosts=tuple(m.host for m in self.active),
            spares=tuple(m.host for m in self.spares),
        )

    def begin(self, plan: LaunchPlan) -> None:
        """An attempt is planned on these nodes: an entry of the run's world begins."""
        if self.launched_with is None:
            self.launched_with = tuple(node.nproc for node in plan.nodes)
        names = tuple(node.name for node in plan.nodes)
        why = self.change if self.world else "launch"  # the start's changes are the launch's
        self.world.append(AttemptWorld(plan.attempt, names, plan.world_size, time.time(), why))

    def running(self) -> None:
        """Every node of the current attempt runs: the last recovery is complete."""
        if self.recoveries and self.recoveries[-1].running_at is None:
            self.recoveries[-1].running_at = time.time()
        if self.world and self.world[-1].running_at is None:
            self.world[-1].running_at = time.time()

    @property
    def connections(self) -> list[NodeConnection]:
        return [m.connection for m in self.active]

    @property
    def facts(self) -> dict[int, NodeFacts]:
        return {i: m.facts for i, m in enumerate(self.active) if m.facts is not None}

    def new_probes(self) -> dict[int, tuple[float, float]]:
        """node rank -> when its preflight probe began and ended (wall clock), for the probes
        not asked for before (a relaunch reports only the nodes probed again)."""
        found = {i: m.probed for i, m in enumerate(self.active) if m.probed is not None}
        for member in self.active:
            member.probed = None
        return found

    # --- the preflight ------------------------------------------------------------------

    def replace_unreachable(self, errors: dict[int, NodeError]) -> None:
        """Hosts and spares that could not be connected to (by index, spares after hosts):
        a spare is dropped, a host is replaced by a spare that was reached. Raises the
        connection errors when the spares cannot make up for the hosts."""
        if not errors:
            return
        everyone = self.active + self.spares
        count = len(self.active)
        lost_hosts = sorted(i for i in errors if i < count)
        lost_spares = [i for i in errors if i >= count]
        spares_left = len(self.spares) - len(lost_spares)
        if not self._can_leave_out(len(lost_hosts) - spares_left):
            raise NodeErrors([errors[i] for i in sorted(errors)], "connecting")
        for index in lost_spares:
            self.spares.remove(everyone[index])
            self._mark_bad(errors[index].host, errors[index].message)
            self.note(f"warning: spare {errors[index]}; it is not used")
        replaced, left_out = lost_hosts[:spares_left], lost_hosts[spares_left:]
        for index in replaced:
            self._replace(index, errors[index].message, None)
        self._leave_out([(everyone[i], errors[i].message) for i in left_out], "cannot be reached")

    def preflight(self, probe: Probe) -> list[str]:
        """Probe every host and spare; a spare that fails is dropped, a host that fails is
        replaced by a spare that passed (and probed again as its node rank). Raises the
        probe's `NodeErrors` when the spares cannot make up for the hosts that failed.
        Returns the probe's warnings."""
        everyone = self.active + self.spares
        cluster = replace(self.base, hosts=tuple(m.host for m in everyone), spares=())
        began = time.time()
        result = probe(cluster, [m.connection for m in everyone], range(len(everyone)))
        for index, member in enumerate(everyone):
            member.facts = result.facts.get(index)
            member.probed = (began, time.time())
        failed_hosts = sorted(i for i in result.failed if i < len(self.active))
        failed_spares = [i for i in result.failed if i >= len(self.active)]
        spares_left = len(self.spares) - len(failed_spares)
        if not self._can_leave_out(len(failed_hosts) - spares_left):
            raise NodeErrors([result.failed[i] for i in sorted(result.failed)], "preflight")
        for index in failed_spares:
            self.spares.remove(everyone[index])
            self._mark_bad(everyone[index].host.name, f"preflight: {result.failed[index].message}")
            self.note(f"warning: spare {result.failed[index]}; it is not used")
        replaced, left_out = failed_hosts[:spares_left], failed_hosts[spares_left:]
        for index in replaced:
            self._replace(index, f"preflight: {result.failed[index].message}", None)
        replaced_members = [self.active[i] for i in replaced]
        first = self.active[0]
        why = [(everyone[i], f"preflight: {result.failed[i].message}") for i in left_out]
        self._leave_out(why, "failed the preflight")
        if replaced or self.active[0] is not first:  # a new node, or a new master
            indices = [
                i for i, m in enumerate(self.active) if any(m is r for r in replaced_members)
            ]
            self._probe_replaced(probe, indices if self.active[0] is first else [0, *indices])
        return list(result.warnings)

    # --- after a run ----------------------------------------------------------------------

    def recover(self, fault: NodeFault | None, probe: Probe | None) -> Recovery | None:
        """Replace the faulty node by the next spare that passes its probe (the new master
        and node 0 are probed again too); None when there is no fault or no spare left.
        Every node a fault takes out goes on the bad-node list, spare or not."""
        if fault is None:
            return None
        if fault.slow:
            self.slow.add(fault.host)
        step = self.after(fault)
        if step is not Next.SPARE:
            self._mark_bad(fault.host, fault.why)
            if step is Next.SHRINK:
                self.attempt += 1
                self._shrink(fault)
                if probe is not None:  # node 0 for a fresh port; everyone if the master moved
                    self._probe_replaced(probe, [0] if fault.index == 0 else [])
            return None
        self.attempt += 1
        recovery = self._replace(fault.index, fault.why, fault.noticed_at)
        if probe is not None:
            self._probe_replaced(probe, [fault.index])
        return recovery

    def after(self, fault: NodeFault | None, back: int = 0) -> Next:
        """What follows an attempt that `fault` ended (None: none), with `back` hosts back
        that its ranks stopped at a checkpoint for: the one decision for every backend
        (attempts/next_attempt.py), from this pool's facts."""
        lost = 1 if fault is not None else 0
        spares = len(self.spares)
        return next_attempt(AttemptEnd(len(self.active), lost, spares, self.min_nodes, back))

    def lose_one(self) -> Next:
        """What a node lost now would lead to (a slow node is taken out only while this
        goes on: supervise/straggler_swap.py)."""
        return next_attempt(AttemptEnd(len(self.active), 1, len(self.spares), self.min_nodes))

    @property
    def may_swap(self) -> bool:
        """Whether a slow node may be taken out at all: --spares or --min-nodes given."""
        return self.spare_count > 0 or self.min_nodes is not None

    def used_up(self, fault: NodeFault | None = None) -> str:
        """Why a node fault ended the run: no spare (given or left), and with --min-nodes,
        the floor reached."""
        if self.min_nodes is not None and fault is not None:
            what = f"{fault.host} {fault_word(fault)}"
            return floor_line(what, len(self.active) - 1, self.most, self.min_nodes)
        if not self.spare_count:
            return "no spare node to replace it (--spares N holds N hosts back for that)"
        taken = ", ".join(f"{r.spare} replaced {r.node}" for r in self.recoveries)
        return f"no spare left: --spares {self.spare_count} used up ({taken or 'none passed'})"

    def going_on(self) -> str:
        """How the run goes on after a node fault (said before the pool acts on it)."""
        if self.spares:
            return "a spare replaces the node and the job starts again"
        return (
            f"the job starts again on the {len(self.active) - 1} node(s) left, from its "
            "checkpoint (--min-nodes)"
        )

    # --- helpers ----------------------------------------------------------------------

    def _shrink(self, fault: NodeFault) -> None:
        """The faulty node is left out: the others keep their order, renumbered."""
        self.gone.append(self.active.pop(fault.index))
        self.change = (
            f"{fault.host} ({fault.why}) left out, no spare left: {len(self.active)} of "
            f"{self.most} nodes"
        )
        what = f"{fault.host} {fault_word(fault)}"
        self.note(going_on_line(what, len(self.active), self.most, self.min_nodes or 0))

    def _can_leave_out(self, count: int) -> bool:
        """Whether `count` hosts that no spare replaces can be left out at the start."""
        if count <= 0:
            return True
        return self.min_nodes is not None and len(self.active) - count >= self.min_nodes

    def _leave_out(self, why: list[tuple[Member, str]], what: str) -> None:
        """--min-nodes: hosts no spare replaced are left out at the start, in one line."""
        if not why:
            return
        for member, reason in why:
            self.active = [m for m in self.active if m is not member]
            self.gone.append(member)  # asked again while the run goes on (start/regrow.py)
            self._mark_bad(member.host.name, reason)
        named = "; ".join(f"{m.host.name} ({reason})" for m, reason in why)
        self.note(
            f"leaving out {len(why)} host(s) that {what}: {named}; going on with "
            f"{len(self.active)} node(s) (--min-nodes {self.min_nodes})"
        )

    def _replace(self, index: int, why: str, noticed_at: float | None) -> Recovery:
        old = self.active[index]
        self._mark_bad(old.host.name, why)
        spare = self._take_spare(index)
        recovery = Recovery(
            self.attempt,
            index,
            old.host.name,
            why,
            spare.host.name,
            noticed_at if noticed_at is not None else time.time(),
        )
        self.recoveries.append(recovery)
        self.change = recovery.describe()
        self.note(
            f"{old.host.name} taken out ({why}); spare {spare.host.name} takes node rank {index}"
        )
        return recovery

    def _take_spare(self, index: int) -> Member:
        """The next spare takes node rank `index`, with the slots of the node it replaces, so
        the world size stays the same."""
        old, spare = self.active[index], self.spares.pop(0)
        host = replace(spare.host, slots=old.host.slots, slot_ids=old.host.slot_ids)
        self.active[index] = Member(host, spare.connection, spare.facts, spare.probed)
        return self.active[index]

    def probe_ranks(self, probe: Probe, indices: Sequence[int]) -> ProbeResult:
        """Probe these node ranks as they stand, keeping each one's facts and probe times."""
        began = time.time()
        result = probe(self.cluster, self.connections, indices)
        for index in indices:
            self.active[index].probed = (began, time.time())
            if index in result.facts:
                self.active[index].facts = result.facts[index]
        return result

    def _probe_replaced(self, probe: Probe, replaced: list[int]) -> None:
        """Probe the replacements as their node ranks (and node 0 for a fresh port; everyone
        when the master moved, since every route leads to it); a replacement that fails is
        replaced by the next spare, until one passes or none is left."""
        while True:
            indices = range(len(self.active)) if 0 in replaced else sorted({0, *replaced})
            result = self.probe_ranks(probe, indices)
            failed = [i for i in result.failed if i in replaced]
            others = [i for i in result.failed if i not in replaced]
            if others or len(failed) > len(self.spares):
                raise NodeErrors([result.failed[i] for i in sorted(result.failed)], "preflight")
            if not failed:
                return
            for index in failed:
                bad = self.active[index].host.name
                self._mark_bad(bad, f"preflight: {result.failed[index].message}")
                spare = self._take_spare(index)
                self.note(
                    f"spare {result.failed[index]}; {spare.host.name} takes node rank {index}"
                )
                for recovery in self.recoveries:
                    if recovery.node_rank == index and recovery.spare == bad:
                        recovery.spare = spare.host.name
            replaced = failed

    def _mark_bad(self, host: str, why: str) -> None:
        if self.bad_nodes:
            try:
                add_bad_node(self.bad_nodes, host, self.run_id, why)
            except OSError as exc:
                self.note(
                    f"warning: cannot add {host} to the bad-node list {self.bad_nodes}: {exc}"
                )
                return
            self.note(f"{host} added to the bad-node list {self.bad_nodes}")

    # --- what the run says about it -------------------------------------------------

    def will_replace(self, outcome: Outcome) -> bool:
        """Whether the run goes on after the node this outcome blames: a spare replaces
        it, or (--min-nodes) the others go on without it."""
        return outcome.node_fault is not None and self.after(outcome.node_fault).goes_on

    def amend(self, outcome: Outcome) -> Outcome:
        """The final outcome with the recoveries in its summary, and, when a node fault
        ended the run, why no spare replaced it; last, the time spent on fewer nodes."""
        lines = [outcome.summary] if outcome.summary else []
        if outcome.node_fault is not None:
            lines.append(self.used_up(outcome.node_fault))
        if self.recoveries:
            lines.append(f"recovered from {len(self.recoveries)} node fault(s) (--spares):")
            lines += [f"  {recovery.describe()}" for recovery in self.recoveries]
        fewer = fewer_nodes_line(self.world, time.time())
        if fewer is not None:
            lines.append(fewer)
        return replace(outcome, summary="\n".join(lines))

    def carry(self, leftover: dict) -> dict:
        """What an attempt leaves for the rest of the run's record (the rank files it could
        not complete: `incomplete_logs`), joined with what earlier attempts left."""
        gaps = [*self.carried.get("incomplete_logs", []), *leftover.get("incomplete_logs", [])]
        self.carried = {**self.carried, **leftover, **({"incomplete_logs": gaps} if gaps else {})}
        return self.carried

    def status(self) -> dict:
        """The recovery part of status.json (with what earlier attempts left: `carry`)."""
        return {
            "attempt": self.attempt,
            "spares": [m.host.name for m in self.spares],
            "recoveries": [r.to_dict() for r in self.recoveries],
            "world": [entry.to_dict() for entry in self.world],
            **self.carried,
        }


def fault_word(fault: NodeFault) -> str:
    """`lost`, or what else the node did: the console's word for a node fault."""
    if fault.slow:
        return f"taken out ({fault.why})"
    return "lost" if fault.why.startswith("lost") else f"failed ({fault.why})"
