# orchestrator 0.1.0 preflight probe of node-b: prints key=value lines, starts nothing.
# Prints the network interface this node uses to reach the address or host name $1:
# the one carrying the address itself on the node that holds it (the route there goes
# through lo), otherwise the device of the route to it. Prints nothing when unknown.
orchestrator_route_ifname() {
    local addr dev
    addr=$(getent ahostsv4 "$1" 2>/dev/null | awk 'NR == 1 {print $1}') || true
    [ -n "$addr" ] || addr=$(getent ahosts "$1" 2>/dev/null | awk 'NR == 1 {print $1}') || true
    [ -n "$addr" ] || addr=$1
    dev=$(ip -o addr show to "$addr" 2>/dev/null | awk 'NR == 1 {print $2}') || true
    if [ -z "$dev" ]; then
        dev=$(ip -o route get "$addr" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p') || true
    fi
    printf '%s\n' "${dev%%@*}"
}

# One interpreter start: its version, and torch's: found where `import torch` looks, its
# version read from torch/version.py (importing torch would cost seconds on every node at
# every launch, and importlib.metadata more CPU than the rest of the probe).
python=/opt/conda/bin/python
if ! facts=$("$python" -  2>&1 <<'PY'
import importlib.util, os, socket, sys
print("python_version=" + sys.version.split()[0])
spec = importlib.util.find_spec("torch")
torch_version = "none" if spec is None else "unknown"
try:
    with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as version_py:
        for line in version_py:
            if line.startswith("__version__"):
                torch_version = line.partition("=")[2].strip().strip("'\"")
                break
except (AttributeError, TypeError, OSError):
    pass
print("torch_version=" + torch_version)
if len(sys.argv) > 1:
    family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
    def bind(port):
        return socket.create_server(("", port), family=family,
                                    dualstack_ipv6=family == socket.AF_INET6)
    if sys.argv[1] == "auto":
        with bind(0) as server:
            print(f"free_port={server.getsockname()[1]}")
    else:
        try:
            bind(int(sys.argv[1])).close()
            print("port_free=yes")
        except OSError:
            print("port_free=no")
PY
); then
    echo "python_error=$(printf '%s' "$facts" | tail -n 1)"
    exit 0
fi
printf '%s\n' "$facts"
echo "ifname=$(orchestrator_route_ifname 10.1.0.1)"
echo "route_source=$(ip -o route get "$(getent ahostsv4 10.1.0.1 2>/dev/null | awk 'NR == 1 {print $1}')" 2>/dev/null | sed -n 's/.* src \([^ ]*\).*/\1/p')"
