"""Node reports as `orchestrator check` builds them, for the pure report and backend tests."""

from __future__ import annotations

from orchestrator.check.facts import Master, NodeReport

MASTER = Master("node0", "10.0.0.1", 29500, 22)


def facts(**extra: str) -> dict[str, str]:
    """A healthy CPU node's probe output, with `extra` keys replaced."""
    base = {
        "python_version": "3.11.7",
        "torch_version": "2.3.1",
        "distributed": "yes",
        "gloo": "yes",
        "nccl": "no",
        "cuda_devices": "0",
        "nccl_version": "",
        "ifname": "eth1",
        "ifname_from": "route",
        "ifname_addr": "10.0.0.3",
        "disk_path": "/home/u/.orchestrator/runs",
        "disk_free_kb": str(50 << 20),
    }
    return {**base, **extra}


def node(index: int, slots: int = 2, **kwargs) -> NodeReport:
    """Node `index` (`node0` is the master, with a free port), connected and reachable."""
    kwargs.setdefault(
        "probe", facts(**({"port": "29500", "port_free": "yes"} if index == 0 else {}))
    )
    kwargs.setdefault("reach", {"reach": "ok", "reach_ms": "0.2"})
    return NodeReport(index, f"node{index}", slots, "/usr/bin/python3", **kwargs)
