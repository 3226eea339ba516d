"""Finding the interface that reaches an address without iproute2
(orchestrator/agent/programs/route.py): parsing the kernel's tables and this machine. The probes run
with `ip` hidden from PATH are in tests/local/test_probes_local.py, agreement with `ip` on the
namespace nodes in test_route_cluster.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator.agent.programs import route

# /proc/net/route as the kernel writes it (little-endian hex): a default route via eth0,
# 10.0.4.0/24 on br0, 10.0.4.128/25 on br1 (longer prefix), 10.9.0.0/16 twice (metrics),
# and a route that is down.
PROC_NET_ROUTE = """\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0
br0\t0004000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
br1\t8004000A\t00000000\t0001\t0\t0\t0\t80FFFFFF\t0\t0\t0
slow0\t0000090A\t00000000\t0001\t0\t0\t200\t0000FFFF\t0\t0\t0
fast0\t0000090A\t00000000\t0001\t0\t0\t10\t0000FFFF\t0\t0\t0
down0\t0000080A\t00000000\t0000\t0\t0\t0\t0000FFFF\t0\t0\t0
"""
PROC_NET_IPV6_ROUTE = """\
fd000000000000000000000000000000 40 00000000000000000000000000000000 00 \
00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
fd000000000000000000000000000001 00000400 00000001 00000000 00000003     eth1
"""
PROC_NET_IF_INET6 = """\
00000000000000000000000000000001 01 80 10 80       lo
fd000000000000000000000000000002 04 40 00 82     eth0
"""


@pytest.mark.parametrize(("addr", "device"), [
    ("10.0.4.7", "br0"),
    ("10.0.4.200", "br1"),  # the longest prefix wins
    ("10.9.1.1", "fast0"),  # then the lowest metric
    ("10.8.0.1", "eth0"),  # a route that is not up is ignored: the default route
    ("192.0.2.50", "eth0"),
    ("fd00::99", "eth0"),
    ("2001:db8::1", "eth1"),  # the IPv6 default route
])  # fmt: skip
def test_route_device_is_the_kernels_main_table_choice(addr: str, device: str) -> None:
    routes = route.parse_routes(PROC_NET_ROUTE, PROC_NET_IPV6_ROUTE)
    assert route.route_device(addr, routes) == device


def test_no_route_is_no_answer() -> None:
    routes = route.parse_routes(PROC_NET_ROUTE.splitlines()[0], "")
    assert route.route_device("10.0.0.1", routes) is None


def test_ipv6_addresses_and_their_holders() -> None:
    assert route.parse_if_inet6(PROC_NET_IF_INET6) == [("lo", "::1"), ("eth0", "fd00::2")]
    assert route.holder("fd00::2", PROC_NET_IF_INET6) == "eth0"
    assert route.holder("fd00::3", PROC_NET_IF_INET6) is None


def test_this_machine_loopback() -> None:
    assert route.ifname("127.0.0.1") == route.ifname("localhost") == "lo"
    assert route.ipv4_address("lo") == "127.0.0.1"
    assert route.ipv4_address("nosuch0") is None
    assert route.source_address("127.0.0.1") == "127.0.0.1"
    assert route.ifname("no-such-host.invalid") is None


def test_cli_prints_one_line_and_refuses_bad_use() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, route.__file__, *args], capture_output=True,
                              text=True, timeout=30)  # fmt: skip

    assert run("ifname", "127.0.0.1").stdout == "lo\n"
    assert run("addr", "nosuch0").stdout == "\n"
    bad = run("where", "x")
    assert bad.returncode == 2 and "ifname ADDR" in bad.stderr
