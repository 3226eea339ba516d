"""Which network interface reaches an address, read from the kernel (standard library only).

The node scripts and probes ask iproute2 (`ip -o addr show to`, `ip -o route get`) where it
is installed, and run this file, shipped as source inside them, where it is not (containers
and minimal images often lack `ip`). It gives the same answers:

    python3 route.py ifname ADDR   the interface holding ADDR on this node, else the one the
                                   route to ADDR leaves by
    python3 route.py source ADDR   the source address the kernel picks to reach ADDR
    python3 route.py addr IFNAME   the interface's IPv4 address
    python3 route.py addrs         every interface's IPv4 address but lo's: IFNAME=ADDR,...

Each prints one line, empty when it cannot tell, and exits 0.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import sys

# ipaddress where it is used: the agent ships this module too (for `addresses`, at every
# job step's start), and importing ipaddress there would cost each start some 5 ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import ipaddress

SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's (primary) IPv4 address
RTF_UP, RTF_REJECT = 0x0001, 0x0200  # linux/route.h


def resolve(host: str) -> str | None:
    """The address ``host`` names: IPv4 first, as `getent ahostsv4` in the scripts."""
    for family in (socket.AF_INET, socket.AF_UNSPEC):
        try:
            return socket.getaddrinfo(host, None, family, socket.SOCK_DGRAM)[0][4][0]
        except (OSError, IndexError):
            continue
    return None


def ipv4_address(ifname: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", ifname.encode()))
        except OSError:  # no IPv4 address, or no such interface
            return None
    return socket.inet_ntoa(answer[20:24])


def parse_if_inet6(text: str) -> list[tuple[str, str]]:
    """(interface, address) pairs from /proc/net/if_inet6."""
    import ipaddress

    pairs = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 6 and len(fields[0]) == 32:
            pairs.append((fields[5], str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))))
    return pairs


def holder(addr: str, if_inet6: str = "") -> str | None:
    """The interface carrying ``addr`` on this node (`ip -o addr show to ADDR`), if any."""
    import ipaddress

    ip = ipaddress.ip_address(addr)
    if ip.version == 4:
        for _, name in socket.if_nameindex():
            if ipv4_address(name) == str(ip):
                return name
        return None
    return next((name for name, held in parse_if_inet6(if_inet6) if held == str(ip)), None)


def parse_routes(route: str, ipv6_route: str) -> list[tuple[ipaddress._BaseNetwork, int, str]]:
    """(network, metric, interface) of every usable route in /proc/net/route and ipv6_route."""
    import ipaddress

    routes: list[tuple[ipaddress._BaseNetwork, int, str]] = []
    for line in route.splitlines()[1:]:  # Iface Destination Gateway Flags ... Metric Mask
        f = line.split()
        if len(f) < 8 or not int(f[3], 16) & RTF_UP or int(f[3], 16) & RTF_REJECT:
            continue
        dest, mask = (socket.inet_ntoa(struct.pack("<I", int(x, 16))) for x in (f[1], f[7]))
        routes.append((ipaddress.ip_network(f"{dest}/{mask}", strict=False), int(f[6]), f[0]))
    for line in ipv6_route.splitlines():  # dest plen src plen nexthop metric ref use flags if
        f = line.split()
        if len(f) < 10 or not int(f[8], 16) & RTF_UP or int(f[8], 16) & RTF_REJECT:
            continue
        dest = ipaddress.IPv6Address(bytes.fromhex(f[0]))
        routes.append((ipaddress.ip_network(f"{dest}/{int(f[1], 16)}"), int(f[5], 16), f[9]))
    return routes


def route_device(addr: str, routes: list[tuple[ipaddress._BaseNetwork, int, str]]) -> str | None:
    """The longest matching prefix, then the lowest metric: the kernel's main-table choice."""
    import ipaddress

    ip = ipaddress.ip_address(addr)
    matches = [r for r in routes if r[0].version == ip.version and ip in r[0]]
    if not matches:
        return None
    return min(matches, key=lambda r: (-r[0].prefixlen, r[1]))[2]


def source_address(addr: str) -> str | None:
    """The source address for ``addr`` (`ip route get`'s src): a UDP connect sends nothing."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((addr, 9))
            return sock.getsockname()[0]
    except OSError:
        return None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def ifname(host: str) -> str | None:
    addr = resolve(host)
    if addr is None:
        return None
    inet6 = _read("/proc/net/if_inet6")
    found = holder(addr, inet6)
    if found is None:
        routes = parse_routes(_read("/proc/net/route"), _read("/proc/net/ipv6_route"))
        found = route_device(addr, routes)
    if found is None:  # policy routing beyond the main table: the source's interface
        source = source_address(addr)
        found = holder(source, inet6) if source is not None else None
    return found


def addresses() -> str:
    """Every interface with an IPv4 address but lo: `IFNAME=ADDR,...` (`ip -o -4 addr`)."""
    pairs = ((name, ipv4_address(name)) for _, name in socket.if_nameindex() if name != "lo")
    return ",".join(f"{name}={addr}" for name, addr in pairs if addr)


def main(argv: list[str]) -> int:
    if argv == ["addrs"]:
        print(addresses())
        return 0
    if len(argv) != 2 or argv[0] not in ("ifname", "source", "addr"):
        print("usage: route.py ifname ADDR | source ADDR | addr IFNAME | addrs", file=sys.stderr)
        return 2
    command, arg = argv
    if command == "ifname":
        answer = ifname(arg)
    elif command == "source":
        addr = resolve(arg)
        answer = source_address(addr) if addr is not None else None
    else:
        answer = ipv4_address(arg)
    print(answer or "")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
