"""Where each rank runs: its local rank on its node, and the device it trains on.

The decisions are pure functions of plain numbers and names (unit-tested with any GPU
count); ``distributed.start_runtime`` feeds them what the ranks told each other through
the rendezvous store, so every rank of a job decides from the same facts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.trainer.exits import TrainerUsageError


@dataclass(frozen=True)
class DeviceChoice:
    """The device type every local rank trains on, and why auto fell back to CPU."""

    kind: str  # "cuda" or "cpu"
    note: str | None = None


def local_placement(hosts: Sequence[str], rank: int) -> tuple[int, int]:
    """(local rank, local world size) of ``rank`` from every rank's host name, in rank order.

    Ranks on the same host share its GPUs, numbered in global rank order, as torchrun
    numbers LOCAL_RANK on each node.
    """
    same_node = [r for r, host in enumerate(hosts) if host == hosts[rank]]
    return same_node.index(rank), len(same_node)


def decide_device(
    preference: str, gpu_count: int, local_rank: int, local_world_size: int
) -> DeviceChoice:
    """Pick CUDA or CPU from the visible GPU count alone (pure, so it is unit-tested).

    auto decides on the node's rank count, never on this rank's index: every rank of a
    node sees the same local world size and GPU count, so all of them pick the same
    backend. (Ranks that chose NCCL and gloo would wait for each other until a timeout.)
    """
    if preference == "cpu" or (preference == "auto" and gpu_count == 0):
        return DeviceChoice("cpu")
    if preference == "auto" and local_world_size > gpu_count:
        return DeviceChoice(
            "cpu",
            f"note: --device auto chose cpu (gloo): {local_world_size} ranks on this node "
            f"but {gpu_count} GPU(s) visible, one needed per rank; start at most "
            f"{gpu_count} rank(s) per node (torchrun --nproc_per_node={gpu_count}) to train "
            "on the GPU(s), or pass --device cpu to choose CPU explicitly",
        )
    if gpu_count == 0:
        raise TrainerUsageError(
            "--device cuda: no CUDA device is visible to this process; use --device cpu"
        )
    if local_world_size > gpu_count:
        raise TrainerUsageError(
            f"--device cuda: {local_world_size} ranks on this node but only {gpu_count} "
            f"GPU(s) visible, one needed per rank; start at most {gpu_count} rank(s) per "
            f"node (torchrun --nproc_per_node={gpu_count}), or use --device auto or cpu"
        )
    if local_rank >= gpu_count:
        # Only reachable with a hand-given --local-rank/LOCAL_RANK that does not fit.
        raise TrainerUsageError(
            f"local rank {local_rank} has no GPU: only {gpu_count} visible; check "
            "--local-rank/--local-world-size (or LOCAL_RANK and LOCAL_WORLD_SIZE), or "
            "use --device cpu"
        )
    return DeviceChoice("cuda")


def agree_on_kind(kinds: Sequence[str], hosts: Sequence[str]) -> DeviceChoice | None:
    """Under --device auto: CPU for all when any node fell back to CPU, else None.

    One process group has one backend: NCCL on the nodes with GPUs and gloo on the others
    would never meet.
    """
    if "cpu" not in kinds or "cuda" not in kinds:
        return None
    without = sorted({host for kind, host in zip(kinds, hosts, strict=True) if kind == "cpu"})
    return DeviceChoice(
        "cpu",
        f"note: --device auto chose cpu (gloo) on every rank: {', '.join(without)} "
        "cannot give each of its ranks a GPU, and one job has one backend; start fewer "
        "ranks there, or pass --device cpu to choose CPU explicitly",
    )


def describe_device(kind: str, local_rank: int, gpu_count: int) -> str:
    """The device part of each rank's start line, with what made it visible."""
    if kind != "cuda":
        return f"cpu ({gpu_count} GPU(s) visible)"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = f", CUDA_VISIBLE_DEVICES={visible}" if visible is not None else ""
    return f"cuda:{local_rank} (of {gpu_count} visible{shown})"
