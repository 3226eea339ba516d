"""`orchestrator check`: what was learned about each node, and the backend that follows from
it. Pure data and decisions: no network, no files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeReport:
    """Everything learned about one node: connection, probe facts, rendezvous reachability."""

    index: int
    host: str
    slots: int
    python: str
    local: bool = False
    ssh_error: str | None = None  # None: connected
    ssh_rtt_ms: float | None = None  # median SSH keepalive round trip
    probe: Mapping[str, str] = field(default_factory=dict)  # check_probe.sh.j2 key=values
    probe_error: str | None = None  # the probe command itself failed
    reach: Mapping[str, str] = field(default_factory=dict)  # orchestrator.check.reach key=values
    reach_skipped: str = ""  # why the TCP test did not run here
    # The slot ids a selection (--include/--exclude/--num-gpus) chose here: the ranks run
    # with CUDA_VISIBLE_DEVICES set to them, so these GPUs must exist. None: no selection,
    # local rank i uses GPU i.
    slot_ids: tuple[int, ...] | None = None

    @property
    def connected(self) -> bool:
        return self.ssh_error is None

    @property
    def usable(self) -> bool:
        """Connected, probed, with a python that runs."""
        return self.connected and self.probe_error is None and "python_version" in self.probe

    def get(self, key: str) -> str:
        return self.probe.get(key, "")

    @property
    def cuda_devices(self) -> int:
        value = self.get("cuda_devices")
        return int(value) if value.isdigit() else 0

    @property
    def gpu_shortfall(self) -> str | None:
        """Why this node cannot give each of its ranks a GPU of its own; None when it can.

        The probe counts the node's GPUs without the selection's CUDA_VISIBLE_DEVICES, so
        chosen slot ids must be below that count (CUDA hides every GPU from an id that does
        not exist on), and without a selection the node needs one GPU per rank.
        """
        have = self.cuda_devices
        if self.slot_ids is None:
            return None if have >= self.slots else f"{have} CUDA device(s) for {self.slots} rank(s)"
        missing = [i for i in self.slot_ids if i >= have]
        if not missing:
            return None
        return (
            f"{have} CUDA device(s), none for the chosen slot id(s) {','.join(map(str, missing))}"
        )

    @property
    def gpu_fix(self) -> str:
        """What to change when `gpu_shortfall` says something."""
        if self.slot_ids is None:
            return "lower slots= / --nproc-per-node"
        return (
            f"choose slot ids below {self.cuda_devices} with --include/--exclude/"
            "--num-gpus, or set slots= to the node's GPU count"
        )

    @property
    def devices_cell(self) -> str:
        """The node table's CUDA/SLOTS cell: GPUs seen / ranks (and the chosen ids)."""
        devices = self.get("cuda_devices") or "-"
        chosen = f" ({','.join(map(str, self.slot_ids))})" if self.slot_ids is not None else ""
        return f"{devices}/{self.slots}{chosen}"

    @property
    def disk_free(self) -> int | None:
        value = self.get("disk_free_kb")
        return int(value) * 1024 if value.isdigit() else None

    @property
    def source(self) -> str:
        """The address NCCL/gloo will bind on this node (the chosen interface's)."""
        return self.get("ifname_addr")

    def to_dict(self) -> dict:
        return {
            "host": self.host,
            "slots": self.slots,
            "python": self.python,
            "slot_ids": list(self.slot_ids) if self.slot_ids is not None else None,
            "local": self.local,
            "ssh_error": self.ssh_error,
            "ssh_rtt_ms": self.ssh_rtt_ms,
            "probe": dict(self.probe),
            "probe_error": self.probe_error,
            "reach": dict(self.reach),
            "reach_skipped": self.reach_skipped or None,
        }


@dataclass(frozen=True)
class Master:
    host: str
    addr: str
    port: int | None  # None: not decided (the master could not be probed)
    sshd_port: int = 22

    @property
    def endpoint(self) -> str:
        return f"{self.addr}:{self.port if self.port is not None else '?'}"


def choose_backend(nodes: Sequence[NodeReport], requested: str = "auto") -> tuple[str, str]:
    """(backend, why): NCCL when every node has a CUDA device per rank and NCCL, else gloo.

    The trainer's --device auto rule: a node with fewer GPUs than ranks runs them on CPU,
    and one job has one backend.
    """
    if requested != "auto":
        return requested, f"--backend {requested}"
    usable = [n for n in nodes if n.usable]
    if not any(n.cuda_devices for n in usable):
        return "gloo", "no CUDA devices"
    if not all(n.cuda_devices > 0 and n.get("nccl") == "yes" for n in usable):
        return "gloo", "not every node has CUDA devices"
    short = [n for n in usable if n.gpu_shortfall]
    if short:
        return "gloo", f"{short[0].host} has {short[0].gpu_shortfall} and NCCL needs one per rank"
    return "nccl", "every node has a CUDA device per rank and NCCL"
