"""What the path check found, read from every node's key=value lines (orchestrator/agent/
programs/reach.py), as failures that each name both ends, the address and port and what happened,
and as a nodes x nodes matrix. Pure: no network."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

STORE = -1  # the `target` of a failure on the way to the master's store port


@dataclass(frozen=True)
class PathNode:
    """One node as the path check uses it: where its job's traffic leaves from."""

    index: int
    host: str
    python: str
    source: str  # the address of the job's interface ("" when unknown: the route's)
    ifname: str = ""
    alternates: tuple[tuple[str, str], ...] = ()  # the node's other (interface, address)


@dataclass(frozen=True)
class PathFailure:
    """One path that does not connect: from `node` to `target` (a node, or STORE)."""

    node: PathNode
    target: int
    target_host: str
    endpoint: str  # address:port tried
    what: str  # refused, no answer within N s, no route...
    works_from: str = ""  # store only: "IFNAME (ADDR)" of an interface that does reach it
    sshd_port: str = ""  # store only: the master's sshd port from the same address

    @property
    def is_store(self) -> bool:
        return self.target == STORE

    def line(self) -> str:
        """The failure as one line, without the node's name in front (NodeError adds it)."""
        via = f" from {self.node.ifname} ({self.node.source})" if self.node.source else ""
        if not self.is_store:
            return f"cannot reach {self.target_host} at {self.endpoint}{via}: {self.what}"
        line = f"cannot reach the master {self.target_host} at {self.endpoint}{via}: {self.what}"
        if self.works_from:
            line += (
                f"; {self.works_from} does reach it: set --ifname (or ifname= in the "
                "hostfile) to it"
            )
        elif self.sshd_port == "ok":
            line += f" (its sshd port answers: a firewall blocks port {self.endpoint_port})"
        return line

    @property
    def endpoint_port(self) -> str:
        return self.endpoint.rpartition(":")[2]


@dataclass(frozen=True)
class PathReport:
    """Every node's outcome: {node: {target: "ok MS" | "error ..." | "skipped ..."}}."""

    nodes: tuple[PathNode, ...]
    outcomes: Mapping[int, Mapping[int, str]]
    failures: tuple[PathFailure, ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    def tested(self) -> int:
        return sum(
            1 for found in self.outcomes.values() for v in found.values() if not v.startswith("s")
        )


def read_report(
    nodes: Sequence[PathNode], outputs: Mapping[int, dict[str, str]], master: str, port: int
) -> PathReport:
    """The failures in what every node said (its key=value lines). A node missing from
    `outputs` did not run the check: its own failure is someone else's to report."""
    hosts = {n.index: n.host for n in nodes}
    outcomes: dict[int, dict[int, str]] = {}
    failures = []
    for node in nodes:
        said = outputs.get(node.index)
        if said is None:
            continue
        found: dict[int, str] = {}
        if said.get("reach") == "ok":
            found[STORE] = f"ok {said.get('reach_ms', '0')}"
        elif said.get("reach") == "error":
            found[STORE] = f"error {said.get('reach_error', '?')}"
            alt = said.get("reach_alt", "")
            name, _, addr = alt.partition(" ")
            failures.append(
                PathFailure(
                    node,
                    STORE,
                    hosts[0],
                    f"{master}:{port}",
                    _plain(said.get("reach_error", "?")),
                    works_from=f"{name} ({addr})" if alt else "",
                    sshd_port=said.get("sshd_port", ""),
                )
            )
        for key, value in said.items():
            if not key.startswith("peer_") or not key[5:].isdigit():
                continue
            target = int(key[5:])
            found[target] = value
            if value.startswith("error "):
                endpoint, _, what = value[6:].partition(" ")
                failures.append(
                    PathFailure(node, target, hosts.get(target, "?"), endpoint, _plain(what))
                )
        outcomes[node.index] = found
    return PathReport(tuple(nodes), outcomes, tuple(failures))


def _plain(reason: str) -> str:
    """errno names as people say them: refused, no route; the rest as it is."""
    for code, words in (
        ("ECONNREFUSED", "refused"),
        ("EHOSTUNREACH", "no route to host"),
        ("ENETUNREACH", "network unreachable"),
    ):
        if reason.startswith(code):
            return words + reason[len(code) :].split(")", 1)[-1]
    return reason


def failure_lines(report: PathReport, limit: int = 12) -> list[tuple[str, str]]:
    """(host, line) per failure, a pair that fails both ways as one line; a node that
    reaches none of its peers as one line; at most `limit`, then how many more."""
    failures = list(report.failures)
    lines: list[tuple[str, str]] = []
    by_pair = {(f.node.index, f.target): f for f in failures if not f.is_store}
    peers_of = {i: [t for t in found if t >= 0] for i, found in report.outcomes.items()}
    isolated = {
        i
        for i, targets in peers_of.items()
        if len(targets) > 2 and all((i, t) in by_pair for t in targets)
    }
    by_index = {n.index: n for n in report.nodes}
    done: set[tuple[int, int]] = set()
    reported: set[int] = set()
    for failure in failures:
        i, j = failure.node.index, failure.target
        if failure.is_store:
            lines.append((failure.node.host, failure.line()))
        elif i in isolated or j in isolated:
            bad = i if i in isolated else j
            if bad not in reported:
                reported.add(bad)
                lines.append(
                    (
                        by_index[bad].host,
                        f"reaches none of its {len(peers_of[bad])} peers, e.g. "
                        f"{failure.node.host} {failure.line()}",
                    )
                )
        elif (i, j) not in done:
            done |= {(i, j), (j, i)}
            back = by_pair.get((j, i))
            line = failure.line()
            if back is not None:
                line += f"; nor can {failure.target_host} reach it at {back.endpoint}: {back.what}"
            lines.append((failure.node.host, line))
    if len(lines) > limit:
        more = len(lines) - limit
        lines = lines[:limit] + [("cluster", f"and {more} more path(s) that do not connect")]
    return lines


def matrix(report: PathReport) -> str:
    """Nodes x nodes: a row per node connecting, a column per target (M: the store),
    `.` connected, `X` did not, `-` not tested. A key follows the table."""
    nodes = report.nodes
    width = max(len(n.host) for n in nodes)
    labels = [str(n.index) for n in nodes]
    cell = max(len(label) for label in labels)
    head = " " * width + "  " + "M".rjust(cell) + " " + " ".join(x.rjust(cell) for x in labels)
    rows = [head]
    for node in nodes:
        found = report.outcomes.get(node.index, {})
        marks = [_mark(found.get(STORE))] + [
            " " if t.index == node.index else _mark(found.get(t.index)) for t in nodes
        ]
        line = node.host.ljust(width) + "  " + " ".join(m.rjust(cell) for m in marks)
        rows.append(line.rstrip())
    key = ", ".join(f"{n.index}={n.host}" for n in nodes)
    rows.append(f"(row: from, column: to; M: the master's store port; {key})")
    rows.append("(. connected, X did not, - not tested)")
    return "\n".join(rows)


def _mark(value: str | None) -> str:
    if value is None or value.startswith("skipped"):
        return "-"
    return "." if value.startswith("ok") else "X"
