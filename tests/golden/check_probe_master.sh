# orchestrator 0.1.0 check of node0: prints key=value lines, starts nothing.
# Answers from iproute2's `ip` where it is installed, else from the kernel's tables through
# the standard library (orchestrator/agent/programs/route.py, below): containers often lack `ip`.
# orchestrator_route_py ifname|source|addr ARG prints the one-line answer of the latter.
orchestrator_route_py() {
    '/opt/py 3/bin/python' - "$@" 2>/dev/null <<'ORCHESTRATOR_ROUTE_PY'
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

ORCHESTRATOR_ROUTE_PY
}
# Prints the network interface this node uses to reach the address or host name $1:
# the one carrying the address itself on the node that holds it (the route there goes
# through lo), otherwise the device of the route to it. Prints nothing when unknown.
orchestrator_route_ifname() {
    local addr dev
    if ! command -v ip >/dev/null 2>&1; then
        orchestrator_route_py ifname "$1" || echo
        return 0
    fi
    addr=$(getent ahostsv4 "$1" 2>/dev/null | awk 'NR == 1 {print $1}') || true
    [ -n "$addr" ] || addr=$(getent ahosts "$1" 2>/dev/null | awk 'NR == 1 {print $1}') || true
    [ -n "$addr" ] || addr=$1
    dev=$(ip -o addr show to "$addr" 2>/dev/null | awk 'NR == 1 {print $2}') || true
    if [ -z "$dev" ]; then
        dev=$(ip -o route get "$addr" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p') || true
    fi
    printf '%s\n' "${dev%%@*}"
}

echo "hostname=$(hostname 2>/dev/null)"
python=('/opt/py 3/bin/python')
if ! version=$("${python[@]}" -c 'import sys; print(sys.version.split()[0])' 2>&1); then
    echo "python_error=$(printf '%s' "$version" | tail -n 1)"
else
    echo "python_version=$version"
    # torch, its NCCL and the CUDA devices it sees (importing torch takes a few seconds)
    "${python[@]}" - <<'PY' 2>/dev/null || echo "torch_error=the torch probe crashed (exit $?)"
try:
    import torch
except Exception as exc:
    print("torch_error=" + (str(exc).splitlines() or [type(exc).__name__])[0])
    raise SystemExit(0)
import torch.distributed as dist
print("torch_version=" + torch.__version__)
print("distributed=" + ("yes" if dist.is_available() else "no"))
print("gloo=" + ("yes" if dist.is_available() and dist.is_gloo_available() else "no"))
print("nccl=" + ("yes" if dist.is_available() and dist.is_nccl_available() else "no"))
try:
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
except Exception:
    devices = 0
print(f"cuda_devices={devices}")
if devices:
    print("cuda_name=" + torch.cuda.get_device_name(0))
try:
    print("nccl_version=" + ".".join(map(str, torch.cuda.nccl.version())))
except Exception:
    print("nccl_version=")
PY
fi

# The interface for NCCL/gloo: as the plan picks it (hostfile, --ifname, else the route).
ifname=eth1
echo "ifname_from=given"
if [ -e /sys/class/net/"$ifname" ] || ip link show "$ifname" >/dev/null 2>&1; then
    echo "ifname_exists=yes"
else
    echo "ifname_exists=no"
fi
echo "ifname=$ifname"
if [ -n "$ifname" ]; then
    if command -v ip >/dev/null 2>&1; then
        echo "ifname_addr=$(ip -o -4 addr show dev "$ifname" 2>/dev/null | awk 'NR == 1 {split($4, a, "/"); print a[1]}')"
    else
        echo "ifname_addr=$(orchestrator_route_py addr "$ifname")"
    fi
fi
# Every interface's IPv4 address (but lo's): the path check binds the job's one, and tries the
# others when it cannot reach the master, to name one that would work.
if command -v ip >/dev/null 2>&1; then
    echo "addrs=$(ip -o -4 addr show 2>/dev/null | awk '$2 != "lo" {sub(/@.*/, "", $2); split($4, a, "/"); printf "%s%s=%s", sep, $2, a[1]; sep = ","}')"
else
    echo "addrs=$(orchestrator_route_py addrs)"
fi

# Free space where the node keeps its runs (the nearest existing folder on the way there).
dir="$HOME/.orchestrator/runs"
while [ ! -d "$dir" ] && [ "$dir" != "/" ]; do dir=$(dirname "$dir"); done
echo "disk_path=$dir"
echo "disk_free_kb=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 {print $4}')"

# The rendezvous port, bound as torchrun's store binds it (all interfaces, SO_REUSEADDR).
'/opt/py 3/bin/python' - 29511 29500 <<'PY' 2>/dev/null || true
import socket, sys
def free(port):
    family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
    try:
        with socket.create_server(("", port), family=family, dualstack_ipv6=family == socket.AF_INET6):
            return True
    except OSError:
        return False
asked, default = sys.argv[1], int(sys.argv[2])
if asked != "auto":
    print("port=" + asked)
    print("port_free=" + ("yes" if free(int(asked)) else "no"))
else:
    if free(default):
        print(f"port={default}")
    else:
        with socket.create_server(("", 0)) as server:
            print(f"port={server.getsockname()[1]}")
    print("port_free=yes")
PY
exit 0
