"""orchestrator/agent/programs/route.py gives `ip`'s answers on every namespace node of the lab."""

from __future__ import annotations

import re
import sys

import pytest

from orchestrator.agent.programs import route
from tests.lab import Cluster

pytestmark = pytest.mark.cluster


def ip_answer(cluster: Cluster, node: str, addr: str) -> tuple[str, str]:
    """(interface, source address) as the scripts read them from iproute2."""
    held = cluster.exec_in(node, ["ip", "-o", "addr", "show", "to", addr], timeout=30).stdout
    got = cluster.exec_in(node, ["ip", "-o", "route", "get", addr], timeout=30).stdout
    dev = held.split()[1] if held.strip() else re.search(r" dev (\S+)", got).group(1)
    return dev.split("@")[0], re.search(r" src (\S+)", got).group(1)


def test_route_module_agrees_with_ip_on_every_node(cluster: Cluster) -> None:
    targets = [node.address for node in cluster.nodes] + ["127.0.0.1"]
    compared = 0
    for node in cluster.nodes:
        for addr in targets:
            expected = ip_answer(cluster, node.name, addr)
            got = tuple(
                cluster.exec_in(node.name, [sys.executable, route.__file__, what, addr],
                                timeout=30).stdout.strip()
                for what in ("ifname", "source")
            )  # fmt: skip
            assert got == expected, (node.name, addr, got, expected)
            compared += 1
        # A node's own address is on its interface (eth0 in the lab), not on lo.
        own = cluster.exec_in(node.name, [sys.executable, route.__file__, "addr",
                                          node.interface], timeout=30).stdout.strip()  # fmt: skip
        assert own == node.address
    assert compared == len(cluster.nodes) * len(targets)
