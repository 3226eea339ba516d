"""--min-nodes growing back: while a run goes on, the hosts it does not run on are asked now
and then (every 30 s, or twice the heartbeat timeout if less) whether they answer SSH and
pass the preflight probe: those a fault took out, those left out at the start, and those
added to the hostfile since the launch (hostfile_watch.py, read at the same interval). One
that does joins at the next checkpoint while the run is on fewer nodes than the launch
chose: the ranks are sent the time limit's warning signal (the bundled trainer saves a
checkpoint and exits 138 on it), and the launcher starts the job again on the larger world
(joining.py). At full size it is held as a spare instead, so the next node lost is
replaced. One that answers but fails its probe is asked again later, said once per reason.

The asking runs in a thread of its own during each attempt; the pool is changed only by
the launcher's thread, between attempts (`settle`), so what the thread finds waits there."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

from orchestrator.backends import close_all, connect_each
from orchestrator.backends.base import NodeConnection
from orchestrator.hosts.hostfile import Host
from orchestrator.start.hostfile_watch import HostfileWatch
from orchestrator.start.joining import room, take
from orchestrator.start.pool import Member, NodePool, Probe
from orchestrator.start.settings import LaunchOptions
from orchestrator.supervise import Supervisor

Connect = Callable[[Host], NodeConnection | None]


class Regrow:
    """The asking of one --min-nodes run, across its attempts."""

    def __init__(
        self,
        pool: NodePool,
        every: float,
        probe: Probe | None,
        connect: Connect,
        hostfile: HostfileWatch | None = None,
    ) -> None:
        self.pool, self.every, self.probe, self.connect = pool, every, probe, connect
        self.hostfile = hostfile
        self.added: list[Member] = []  # hosts added to the hostfile, asked until they answer
        self.found: list[tuple[Member, bool]] = []  # answered and passed: joins, or a spare
        self.said: dict[str, str] = {}  # host -> the last reason said for not taking it
        self.lock = threading.Lock()

    @classmethod
    def of(
        cls, pool: NodePool, options: LaunchOptions, probe: Probe | None, nproc: int | None
    ) -> Regrow | None:
        """The asking of a run with --min-nodes over SSH; None without the flag, or with
        --time, whose warning signal belongs to the time limit. `probe`: the preflight's
        (None with --no-preflight: a host that answers is taken); `nproc`:
        --nproc-per-node, for a selection applied to an edited hostfile."""
        if pool.min_nodes is None or options.deadline.limit_s is not None:
            return None

        def connect(host: Host) -> NodeConnection | None:
            try:
                connections, errors = connect_each(
                    replace(pool.base, hosts=(host,), spares=()), options.ssh
                )
            except Exception:  # not back yet, whatever the way it failed
                return None
            return None if errors else connections[0]

        watch = HostfileWatch.of(pool.base.path, options.hosts, nproc)
        return cls(pool, options.supervision.ask_again_every, probe, connect, watch)

    def watch(self, supervisor: Supervisor) -> None:
        """Ask in a thread of its own until the attempt ends."""

        def asking() -> None:
            while not supervisor.ended.wait(self.every):
                self.round(supervisor)

        threading.Thread(target=asking, name="regrow", daemon=True).start()

    def round(self, supervisor: Supervisor) -> None:
        """One round: the hostfile read if it changed, then every host asked once."""
        if self.hostfile is not None:
            self.read_hostfile(self.hostfile, supervisor.sink.note)
        for member in self.asked():
            if supervisor.ended.is_set():
                return
            try:
                self.ask(member, supervisor)
            except Exception as exc:  # a node's odd answer never ends the run
                if not supervisor.ended.is_set():
                    supervisor.sink.note(f"warning: asking {member.host.name} again: {exc}")

    def read_hostfile(self, hostfile: HostfileWatch, note: Callable[[str], None]) -> None:
        """The hosts added to the hostfile since it was last read are asked from now on."""
        edit = hostfile.read()
        for line in edit.lines:
            note(line)
        known = {m.host.name for m in self.members()}
        new = [host for host in edit.added if host.name not in known]
        if not new:
            return
        with self.lock:
            self.added += [Member(host, None) for host in new]
        note(
            f"{hostfile.path} edited: asking {', '.join(h.name for h in new)} (added); each "
            f"joins at a checkpoint while the run is on fewer than {self.pool.most} nodes, "
            "else it is held as a spare"
        )

    def members(self) -> list[Member]:
        """Every host the run knows of: running, spare, asked, or found."""
        pool = self.pool
        with self.lock:
            found = [member for member, _ in self.found]
            return [*pool.active, *pool.spares, *pool.gone, *pool.back, *self.added, *found]

    def asked(self) -> list[Member]:
        """The hosts to ask this round: taken out (not for being slow), left out, or added,
        and not found yet."""
        with self.lock:
            found = {member.host.name for member, _ in self.found}
            found |= self.pool.slow  # taken out for being slow: still slow if it answers
            return [m for m in [*self.pool.gone, *self.added] if m.host.name not in found]

    def ask(self, member: Member, supervisor: Supervisor) -> None:
        """Whether `member` answers and passes the probe as the next node rank; if so, it
        is found: it joins at a checkpoint (the ranks are asked for one), or is a spare."""
        name, pool = member.host.name, self.pool
        word = "answers" if any(m is member for m in self.added) else "back"
        connection = self.connect(member.host)
        if connection is None:
            return
        facts = None
        if self.probe is not None and not supervisor.ended.is_set():
            cluster = replace(pool.cluster, hosts=(*pool.cluster.hosts, member.host))
            index = len(cluster.hosts) - 1
            try:
                result = self.probe(cluster, [*pool.connections, connection], [index])
            except BaseException:
                close_all([connection])
                raise
            if index in result.failed:
                close_all([connection])
                self.say_once(name, result.failed[index].message, supervisor.sink.note)
                return
            facts = result.facts.get(index)
        with self.lock:
            if supervisor.ended.is_set():  # too late for this attempt: asked in the next
                close_all([connection])
                return
            joins = room(pool) - sum(j for _, j in self.found) > 0
            self.found.append((Member(member.host, connection, facts), joins))
            self.added = [m for m in self.added if m is not member]
            size = len(pool.active) + len(pool.back) + sum(j for _, j in self.found)
            spares = len(pool.spares) + sum(not j for _, j in self.found)
        self.said.pop(name, None)
        if joins:
            supervisor.sink.note(f"{name} {word}; growing to {size} nodes at the next checkpoint")
            supervisor.ask_checkpoint(f"growing to {size} nodes")
        else:
            supervisor.sink.note(
                f"{name} {word}; held as a spare ({spares} spare(s)): it replaces the next "
                "node lost"
            )

    def say_once(self, name: str, why: str, note: Callable[[str], None]) -> None:
        """A host that answers but fails its probe, said again only when the reason changes."""
        if self.said.get(name) != why:
            self.said[name] = why
            every = f"{self.every:g}"
            note(f"{name} answers but fails the preflight ({why}); asked again every {every} s")

    def settle(self) -> None:
        """After an attempt (the launcher's thread): the hosts found join the pool."""
        with self.lock:
            found, self.found = self.found, []
        for member, joins in found:
            take(self.pool, member, joins)
