# orchestrator 0.1.0 check of node0: prints key=value lines, starts nothing.
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

echo "hostname=$(hostname 2>/dev/null)"
python='/opt/py 3/bin/python'
if ! version=$("$python" -c 'import sys; print(sys.version.split()[0])' 2>&1); then
    echo "python_error=$(printf '%s' "$version" | tail -n 1)"
else
    echo "python_version=$version"
    # torch, its NCCL and the CUDA devices it sees (importing torch takes a few seconds)
    "$python" - <<'PY' 2>/dev/null || echo "torch_error=the torch probe crashed (exit $?)"
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
    echo "ifname_addr=$(ip -o -4 addr show dev "$ifname" 2>/dev/null | awk 'NR == 1 {split($4, a, "/"); print a[1]}')"
fi

# Free space where the node keeps its runs (the nearest existing folder on the way there).
dir="$HOME/.orchestrator/runs"
while [ ! -d "$dir" ] && [ "$dir" != "/" ]; do dir=$(dirname "$dir"); done
echo "disk_path=$dir"
echo "disk_free_kb=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 {print $4}')"

# The rendezvous port, bound as torchrun's store binds it (all interfaces, SO_REUSEADDR).
"$python" - 29511 29500 <<'PY' 2>/dev/null || true
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
