"""Process group setup and the few collectives the trainer needs.

A plain ``python -m orchestrator.trainer`` runs as world size 1 with no process group;
every collective here is then a no-op, so the training loop has one code path.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from orchestrator.trainer.config import Topology
from orchestrator.trainer.exits import TrainerRuntimeError, TrainerUsageError
from orchestrator.trainer.placement import (
    DeviceChoice,
    agree_on_kind,
    decide_device,
    describe_device,
    local_placement,
)
from orchestrator.trainer.reporting import emit

# Keys of the trainer's own exchanges in the rendezvous store (torch's groups use others).
STORE_PREFIX = "orchestrator-trainer"


@dataclass
class Runtime:
    """This process's place in the job, its device, and its process groups."""

    topology: Topology
    device: torch.device
    backend: str | None  # None when running alone without a process group
    threads: int
    # Small CPU-side messages (stop flags, setup errors, RNG states, checkpoint
    # broadcast) go over a gloo group, so they never wait on the GPU stream.
    control_group: Any = None
    device_info: str = ""  # how the device was chosen, for the start line

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    @property
    def is_main(self) -> bool:
        return self.topology.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over ranks in place (on the training backend) and return it."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_gather_objects(self, obj: object) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.control_group)
        return out

    def broadcast_object(self, obj: object) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control_group)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.control_group)

    def shutdown(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


def configure_threads(topology: Topology, device: torch.device) -> int:
    """Give each local rank its share of the CPU cores unless the user already chose.

    torchrun exports OMP_NUM_THREADS=1 when it starts more than one process per node,
    and torch has read it by now; an explicit value always wins.
    """
    if "OMP_NUM_THREADS" in os.environ or device.type != "cpu":
        return torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // max(1, topology.local_world_size or 1))
    torch.set_num_threads(threads)
    return threads


def visible_gpus() -> int:
    """GPUs this process may use: torch counts only those CUDA_VISIBLE_DEVICES lets through."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def start_runtime(topology: Topology, device_preference: str, timeout_s: float) -> Runtime:
    """Meet the other ranks, agree on the device and backend, and join the process group.

    Every wait here (the rendezvous, the exchanges through its store, the groups'
    collectives) gives up after ``timeout_s``, so a rank that never comes, or that dies
    on the way, ends the others with exit 1 instead of a hang.
    """
    gpus = visible_gpus()
    if not topology.is_distributed:
        local_rank, local_world = topology.local_rank or 0, topology.local_world_size or 1
        choice = decide_device(device_preference, gpus, local_rank, local_world)
        return _runtime(topology, choice, gpus, None)
    # What torchrun's agent sets for its workers, for ranks started without it too: a
    # failed or timed-out NCCL collective aborts the communicator and ends the process
    # instead of leaving it blocked on the GPU. A value the user set wins.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    timeout = timedelta(seconds=timeout_s)
    try:
        store = _rendezvous(topology, timeout)
        topology = _place(store, topology)
    except RuntimeError as exc:  # DistNetworkError, DistStoreError: a peer not reached
        raise TrainerRuntimeError(_join_failure(topology, exc)) from None
    choice = _agree_on_device(store, topology, device_preference, gpus)
    backend = "nccl" if choice.kind == "cuda" else "gloo"
    init_kwargs: dict[str, Any] = {}
    if choice.kind == "cuda":  # NCCL connects eagerly, bound to this rank's GPU
        init_kwargs["device_id"] = torch.device("cuda", topology.local_rank)
    try:
        # The store is the one the rendezvous made, prefixed as torch prefixes its own.
        dist.init_process_group(
            backend,
            store=dist.PrefixStore("default_pg", store),
            rank=topology.rank,
            world_size=topology.world_size,
            timeout=timeout,
            **init_kwargs,
        )
        # A separate gloo group even when training on gloo: control messages then never
        # queue behind (or in front of) DDP's gradient buckets. Its timeout is given
        # again: new_group would otherwise take gloo's default of 30 minutes.
        control = dist.new_group(backend="gloo", timeout=timeout)
    except RuntimeError as exc:
        raise TrainerRuntimeError(_join_failure(topology, exc)) from None
    return _runtime(topology, choice, gpus, backend, control)


def _runtime(
    topology: Topology,
    choice: DeviceChoice,
    gpus: int,
    backend: str | None,
    control: Any = None,
) -> Runtime:
    local_rank = topology.local_rank or 0
    if choice.note is not None and topology.rank == 0:
        emit(choice.note)
    if choice.kind == "cuda":
        torch.cuda.set_device(local_rank)
        # The autograd engine runs backward on a thread of its own, which has no current
        # CUDA context at its first cuBLAS call; torch then sets the primary context itself
        # and says so on stderr (seen with torch 2.11 on an H200). Nothing for a user to do.
        warnings.filterwarnings(
            "ignore", message="Attempting to run cuBLAS, but there was no current CUDA context"
        )
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    threads = configure_threads(topology, device)
    where = describe_device(choice.kind, local_rank, gpus)
    return Runtime(topology, device, backend, threads, control, where)


def _rendezvous(topology: Topology, timeout: timedelta) -> Any:
    """The rendezvous store (torch's own handlers for env://, tcp:// and file://)."""
    explicit = topology.launcher == "explicit"
    rank, world = (topology.rank, topology.world_size) if explicit else (-1, -1)
    assert topology.init_method is not None
    store, _, _ = next(dist.rendezvous(topology.init_method, rank, world, timeout=timeout))
    store.set_timeout(timeout)
    return store


def _exchange(store: Any, topology: Topology, name: str, value: str) -> list[str]:
    """Every rank's ``value``, in rank order; waits for all of them up to the timeout."""
    store.set(f"{STORE_PREFIX}/{name}/{topology.rank}", value)
    return [store.get(f"{STORE_PREFIX}/{name}/{r}").decode() for r in range(topology.world_size)]


def _place(store: Any, topology: Topology) -> Topology:
    """Fill in local rank and local world size from the ranks' host names when unknown."""
    if topology.local_rank is not None:
        return topology
    hosts = _exchange(store, topology, "host", socket.gethostname())
    local_rank, local_world = local_placement(hosts, topology.rank)
    return replace(topology, local_rank=local_rank, local_world_size=local_world)


def _agree_on_device(store: Any, topology: Topology, preference: str, gpus: int) -> DeviceChoice:
    """Each rank decides for its node; any rank's error, or a CPU fallback, holds for all."""
    assert topology.local_rank is not None and topology.local_world_size is not None
    try:
        choice = decide_device(preference, gpus, topology.local_rank, topology.local_world_size)
        mine = choice.kind
    except TrainerUsageError as exc:
        choice, mine = None, f"error {exc}"
    try:
        answers = [
            answer.split("\t", 1)
            for answer in _exchange(store, topology, "device", f"{socket.gethostname()}\t{mine}")
        ]
    except RuntimeError as exc:
        raise TrainerRuntimeError(_join_failure(topology, exc)) from None
    hosts = [host for host, _ in answers]
    for rank, (host, answer) in enumerate(answers):
        if answer.startswith("error "):
            _wait_until_all_read(store, topology)
            message = answer.removeprefix("error ")
            raise TrainerUsageError(
                message if rank == topology.rank else f"rank {rank} ({host}): {message}"
            )
    assert choice is not None
    return agree_on_kind([kind for _, kind in answers], hosts) or choice


def _wait_until_all_read(store: Any, topology: Topology) -> None:
    """Before exiting on an agreed error, let every rank read it: rank 0 serves the
    tcp:// and env:// store, and a rank still reading would see a lost connection instead."""
    key = f"{STORE_PREFIX}/error-read"
    count = store.add(key, 1)
    deadline = time.monotonic() + store.timeout.total_seconds()
    while topology.rank == 0 and count < topology.world_size and time.monotonic() < deadline:
        time.sleep(0.05)
        count = store.add(key, 0)


# How gloo and NCCL word a collective that failed because of a peer (torch raises some of
# these as a plain RuntimeError, not a DistError).
PEER_FAILURE_MARKERS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "Timed out waiting",
    "timed out",
    "Watchdog caught collective operation timeout",
    "NCCL communicator was aborted",
    "remote process exited",
)


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says a collective failed because another rank died or went silent."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return any(marker in text for marker in PEER_FAILURE_MARKERS)


def _join_failure(topology: Topology, exc: BaseException) -> str:
    if topology.launcher == "torchrun":
        where = (
            f"MASTER_ADDR:MASTER_PORT {os.environ.get('MASTER_ADDR')}:"
            f"{os.environ.get('MASTER_PORT')}"
        )
    else:
        where = f"--init-method {topology.init_method}"
    reason = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:200]
    if (topology.init_method or "").startswith("file://"):
        reach = "that the file is on a filesystem every rank's node shares"
    else:
        reach = "that its host and port are reachable from this node"
    return (
        f"{where}: rank {topology.rank} of {topology.world_size} could not join the "
        f"process group ({reason}); check that every rank was started with the same "
        f"address and world size, that rank 0 is running, and {reach}"
    )
