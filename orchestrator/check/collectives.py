"""The job `orchestrator check` runs on every rank: `python -m orchestrator.check.collectives`.

Started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the environment)
through the same launch path as any job. Every rank runs all_reduce, reduce_scatter,
all_gather and broadcast (a scalar and a vector case each) and a barrier, compares its own
results with the exact values of orchestrator.check, then (unless --skip-bandwidth) times
all_reduce and all_gather over doubling sizes. Each result is one `ORCHESTRATOR_CHECK {json}`
line on stdout, which the controller reads back from the run's rank logs.

torch is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta

import orchestrator.sizes as sizes
from orchestrator.check import measure

EXIT_TIMEOUT = 124


class Reporter:
    """Prints this rank's records and remembers whether all of them passed."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.ok = True
        self.phase = "starting"
        self.lock = threading.Lock()

    def emit(self, kind: str, **fields: object) -> None:
        if fields.get("ok") is False:
            self.ok = False
        with self.lock:
            record = {"kind": kind, "rank": self.rank, "t": round(time.time(), 3), **fields}
            print(measure.report_line(record), flush=True)


def start_watchdog(reporter: Reporter, timeout: float) -> threading.Timer:
    """After `timeout` seconds, report where this rank was stuck and end the process."""

    def expire() -> None:
        reporter.emit(
            "error",
            ok=False,
            phase=reporter.phase,
            error=f"timed out after {timeout:g} s during {reporter.phase}",
        )
        sys.stdout.flush()
        os._exit(EXIT_TIMEOUT)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    return timer


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.check.collectives", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument(
        "--max-size",
        type=sizes.parse_size,
        default=None,
        help="largest bandwidth message, e.g. 64M (default: 64M on gloo, 1G on nccl)",
    )
    parser.add_argument("--skip-bandwidth", action="store_true")
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="give up (exit 124) after this many seconds"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    reporter = Reporter(rank)
    start_watchdog(reporter, args.timeout)
    try:
        return run(args, reporter)
    except Exception as exc:  # every failure becomes a report line naming the phase
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        reporter.emit("error", ok=False, phase=reporter.phase, error=last)
        traceback.print_exc()
        return 1


def run(args: argparse.Namespace, reporter: Reporter) -> int:
    reporter.phase = "import torch"
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if measure.on_gpus(args.backend):
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    reporter.phase = "init_process_group"
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # CUDA_VISIBLE_DEVICES as the rank sees it: a selection's slot ids (--include ...)
    reporter.emit(
        "start",
        world_size=world_size,
        local_rank=local_rank,
        backend=args.backend,
        device=str(device),
        host=socket.gethostname(),
        torch=torch.__version__,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def barrier() -> None:
        if measure.on_gpus(args.backend):
            dist.barrier(device_ids=[local_rank])
        else:
            dist.barrier()

    for op in measure.OPS:
        for case in ("scalar", "vector"):
            reporter.phase = f"{op} ({case})"
            barrier()
            started = time.perf_counter()
            got, expected = run_case(torch, dist, op, case, rank, world_size, device)
            sync()
            elapsed_ms = (time.perf_counter() - started) * 1e3
            mismatch = measure.first_mismatch(got, expected)
            fields: dict[str, object] = {
                "op": op,
                "case": case,
                "ok": mismatch is None,
                "ms": round(elapsed_ms, 3),
            }
            if case == "scalar":
                fields["got"] = got
            if mismatch is not None:
                fields["mismatch"] = mismatch.describe()
            reporter.emit("result", **fields)

    reporter.phase = "barrier"
    started = time.perf_counter()
    barrier()
    reporter.emit(
        "result", op="barrier", case="", ok=True, ms=round((time.perf_counter() - started) * 1e3, 3)
    )

    if not args.skip_bandwidth:
        max_size = args.max_size or measure.DEFAULT_MAX_SIZE[args.backend]
        for op in measure.BANDWIDTH_OPS:
            for size in measure.sweep_sizes(max_size):
                reporter.phase = f"bandwidth {op} {sizes.format_size(size)}"
                row = time_op(torch, dist, op, size, world_size, device, sync, barrier)
                if rank == 0:
                    reporter.emit(
                        "bandwidth",
                        op=op,
                        size=row.size,
                        count=row.count,
                        seconds=row.seconds,
                        warmup=row.warmup,
                        iters=row.iters,
                    )

    reporter.phase = "final barrier"
    barrier()
    reporter.emit("done", ok=reporter.ok)
    dist.destroy_process_group()
    reporter.emit("destroyed")
    return 0 if reporter.ok else 1


def run_case(
    torch, dist, op: str, case: str, rank: int, world_size: int, device
) -> tuple[list[int], list[int]]:
    """Run one case of `op`; return (what this rank got, what it must get), flattened."""

    def tensor(values: list[int]):
        return torch.tensor(values, dtype=torch.int64, device=device)

    n = world_size
    if case == "scalar":
        mine = [measure.scalar_input(op, rank, n)]
        expected = measure.expected_scalar(op, rank, n)
        inputs = [mine] * n  # reduce_scatter: every chunk of the input list is the rank
        root = 0
    else:
        inputs = measure.vector_input(op, rank, n)
        mine = inputs[0]
        expected = measure.expected_vector(op, rank, n)
        root = measure.broadcast_root(n)
    length = len(mine)
    if op == "all_reduce":
        result = tensor(mine)
        dist.all_reduce(result)
        got = result
    elif op == "reduce_scatter":
        got = torch.full((length,), -1, dtype=torch.int64, device=device)
        dist.reduce_scatter(got, [tensor(chunk) for chunk in inputs])
    elif op == "all_gather":
        outputs = [torch.full((length,), -1, dtype=torch.int64, device=device) for _ in range(n)]
        dist.all_gather(outputs, tensor(mine))
        got = torch.cat(outputs)
    elif op == "broadcast":
        if case == "vector" and rank != root:
            mine = [-1] * length
        got = tensor(mine)
        dist.broadcast(got, src=root)
    else:
        raise ValueError(f"unknown op {op!r}")
    return got.cpu().tolist(), expected


def time_op(
    torch, dist, op: str, size: int, world_size: int, device, sync, barrier
) -> measure.BandwidthRow:
    """Time one op at one size: warm-up, then the mean of the timed iterations on this
    rank, averaged over all ranks (as nccl-tests reports it). The number of timed
    iterations follows the slowest rank's last warm-up (see measure.timed_iterations)."""
    count = measure.elements_per_rank(op, size, world_size)
    warmup = measure.warmup_iterations(size)
    if op == "all_reduce":
        buffer = torch.zeros(count, dtype=torch.float32, device=device)

        def once() -> None:
            dist.all_reduce(buffer)
    else:
        send = torch.zeros(count, dtype=torch.float32, device=device)
        receive = torch.zeros(count * world_size, dtype=torch.float32, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

        def once() -> None:
            gather(receive, send)

    for _ in range(warmup):
        began = time.perf_counter()
        once()
        sync()
    slowest = torch.tensor([time.perf_counter() - began], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    iters = measure.timed_iterations(slowest.item())
    barrier()
    started = time.perf_counter()
    for _ in range(iters):
        once()
    sync()
    mean = torch.tensor(
        [(time.perf_counter() - started) / iters], dtype=torch.float64, device=device
    )
    dist.all_reduce(mean)
    seconds = mean.item() / world_size
    return measure.BandwidthRow(
        op, measure.bytes_moved(op, count, world_size), count, seconds, world_size, warmup, iters
    )


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is reported and the process group is gone; skip the interpreter's
    # teardown of torch, which takes seconds on a busy node and only delays the run's end.
    os._exit(code)
