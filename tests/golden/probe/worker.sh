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

python=/opt/conda/bin/python
if ! version=$("$python" -c 'import sys; print(sys.version.split()[0])' 2>&1); then
    echo "python_error=$(printf '%s' "$version" | tail -n 1)"
    exit 0
fi
echo "python_version=$version"
echo "torch_version=$("$python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || echo none)"
echo "ifname=$(orchestrator_route_ifname 10.1.0.1)"
echo "route_source=$(ip -o route get "$(getent ahostsv4 10.1.0.1 2>/dev/null | awk 'NR == 1 {print $1}')" 2>/dev/null | sed -n 's/.* src \([^ ]*\).*/\1/p')"
