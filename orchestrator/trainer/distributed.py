"""Process group setup, the few collectives the trainer needs, and agreeing to stop.

A plain ``python -m orchestrator.trainer`` runs as world size 1 with no process group;
every collective here is then a no-op, so the training loop has one code path.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from orchestrator.trainer.config import Topology
from orchestrator.trainer.errors import TrainerRuntimeError, TrainerUsageError
from orchestrator.trainer.reporting import emit
from orchestrator.trainer.stopping import StopRequest


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
    threads = max(1, (cores or 1) // max(1, topology.local_world_size))
    torch.set_num_threads(threads)
    return threads


@dataclass(frozen=True)
class DeviceChoice:
    """The device type every local rank trains on, and why auto fell back to CPU."""

    kind: str  # "cuda" or "cpu"
    note: str | None = None


def decide_device(
    preference: str, gpu_count: int, local_rank: int, local_world_size: int
) -> DeviceChoice:
    """Pick CUDA or CPU from the visible GPU count alone (pure, so it is unit-tested).

    auto decides on the node's rank count, never on this rank's index: every rank of a
    node sees the same LOCAL_WORLD_SIZE and GPU count, so all of them pick the same
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
        # Reached with --init-method, where LOCAL_RANK defaults to the global rank and
        # LOCAL_WORLD_SIZE to 1 unless the user exports them per node.
        raise TrainerUsageError(
            f"local rank {local_rank} has no GPU: only {gpu_count} visible; start at most "
            f"{gpu_count} rank(s) per node, setting LOCAL_RANK and LOCAL_WORLD_SIZE for each "
            "when starting ranks by hand, or use --device cpu"
        )
    return DeviceChoice("cuda")


def choose_device(preference: str, topology: Topology) -> DeviceChoice:
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return decide_device(preference, gpu_count, topology.local_rank, topology.local_world_size)


def start_runtime(topology: Topology, device_preference: str) -> Runtime:
    """Pick the device and backend (NCCL with CUDA, gloo otherwise) and join the group."""
    choice = choose_device(device_preference, topology)
    if choice.note is not None and topology.rank == 0:
        emit(choice.note)
    if choice.kind == "cuda":
        torch.cuda.set_device(topology.local_rank)
        device = torch.device("cuda", topology.local_rank)
    else:
        device = torch.device("cpu")
    threads = configure_threads(topology, device)
    if not topology.is_distributed:
        return Runtime(topology, device, None, threads)
    backend = "nccl" if device.type == "cuda" else "gloo"
    init_kwargs: dict[str, Any] = {"backend": backend, "init_method": topology.init_method}
    if topology.launcher == "explicit":
        init_kwargs.update(rank=topology.rank, world_size=topology.world_size)
    if device.type == "cuda":
        init_kwargs["device_id"] = device
    try:
        dist.init_process_group(**init_kwargs)
        # A separate gloo group even when training on gloo: control messages then never
        # queue behind (or in front of) DDP's gradient buckets.
        control = dist.new_group(backend="gloo")
    except RuntimeError as exc:  # DistNetworkError, DistStoreError, gloo's own errors
        # Bad URLs were refused before torch was imported (config.resolve_topology);
        # what is left is a peer or address this rank could not reach in time.
        raise TrainerRuntimeError(_join_failure(topology, exc)) from None
    return Runtime(topology, device, backend, threads, control)


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


class StopAgreement:
    """Lets all ranks stop after the same optimizer step, whoever got the signal.

    Ranks see a signal at slightly different times, and a rank that left the loop
    alone would leave the others blocked in the next gradient all-reduce. So at agreed
    steps every rank takes part in a tiny MAX all-reduce (on the gloo control group,
    so it never waits on a GPU stream) of [its signal number, -its proposed interval]
    and all act on the same result.

    A check costs from half a millisecond to a whole small step (it holds every rank
    still for the slowest: 25-30% of the throughput of a small CPU model when made at
    every step, benchmarks/bench_trainer.py), so by default the interval adapts: each
    check proposes the number of steps that takes about ``target_s`` of training (at
    least 1, so slow steps check every step), and the smallest proposal wins. A stop
    therefore lands within about ``target_s`` or one step of the signal, whichever is
    longer, at about 1% of the throughput.
    ``every`` fixes the interval instead.
    """

    def __init__(
        self,
        runtime: Runtime,
        request: StopRequest,
        every: int | None = None,
        target_s: float = 0.25,
        max_interval: int = 1000,
    ) -> None:
        self.runtime = runtime
        self.request = request
        self.every = every
        self.target_s = target_s
        self.max_interval = max_interval
        self.interval = every or 1
        self.checks = 0
        self._next: int | None = None
        self._last: tuple[int, float] | None = None  # (step, time) of the previous check

    def poll(self, completed_steps: int) -> int:
        """Call after every optimizer step on every rank; returns the agreed signal or 0."""
        if not self.runtime.distributed:
            return self.request.signum
        if self._next is None:
            self._next = completed_steps
        if completed_steps < self._next:
            return 0
        now = time.perf_counter()
        message = torch.tensor(
            [self.request.signum, -self._propose(completed_steps, now)], dtype=torch.int64
        )
        dist.all_reduce(message, op=dist.ReduceOp.MAX, group=self.runtime.control_group)
        self.checks += 1
        signum, interval = int(message[0]), -int(message[1])
        self.interval = interval
        self._next = completed_steps + interval
        self._last = (completed_steps, now)
        return signum

    def _propose(self, step: int, now: float) -> int:
        if self.every is not None:
            return self.every
        if self._last is None or step == self._last[0]:
            return 1
        step_s = (now - self._last[1]) / (step - self._last[0])
        return max(1, min(self.max_interval, int(self.target_s / max(step_s, 1e-9))))
