"""Throughput of the bundled trainer against a plain hand-written DDP loop.

Both run under real torchrun with the same model, synthetic data, per-rank batch size,
number of ranks and steps; repetitions alternate between them so machine load drifts
affect both alike. Prints the median and best samples/s of each, their ratios, and the
share of step time each spent waiting for data. Two more trainer variants check for a stop
signal every step, or never, to show what the default adaptive check costs: each checked
run against the unchecked run of the same repetition, median over the repetitions.

    python benchmarks/bench_trainer.py                 # CPU, 2 ranks, gloo
    python benchmarks/bench_trainer.py --gpu           # 1 GPU, NCCL, bf16, pinned memory

Throughput counts the training loop only (process start and torch import excluded).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAINER_DONE = re.compile(r"^done: .*?, ([\d.]+) samples/s, data wait ([\d.]+)%", re.M)
BASELINE_DONE = re.compile(r"^baseline done: .*?, ([\d.]+) samples/s, data wait ([\d.]+)%", re.M)


def torchrun(nproc: int, target: list[str], threads: int) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", *target]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if result.returncode != 0:
        sys.exit(f"benchmark run failed ({' '.join(cmd)}):\n{result.stdout}\n{result.stderr}")
    return result.stdout


def parse(pattern: re.Pattern[str], output: str) -> tuple[float, float]:
    match = pattern.search(output)
    if match is None:
        sys.exit(f"no summary line in output:\n{output}")
    return float(match.group(1)), float(match.group(2)) / 100


def nccl_version() -> str:
    import torch

    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):  # a build without NCCL
        return "unavailable"
    # A tuple (2, 21, 5) in current torch; older releases returned one int (2708).
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each variant")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--nproc", type=int, help="ranks (default: 2 on CPU, 1 with --gpu)")
    parser.add_argument("--gpu", action="store_true", help="NCCL, bf16 autocast, pinned memory")
    args = parser.parse_args()

    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            print("GPU mode skipped: torch.cuda.is_available() is False on this machine "
                  "(CPU-only torch build or no visible GPU); run without --gpu for the "
                  "CPU comparison.")  # fmt: skip
            return
    nproc = args.nproc or (1 if args.gpu else 2)
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // nproc)
    samples = 16384
    common = ["--batch-size", str(args.batch_size), "--model", args.model]
    trainer = ["-m", "orchestrator.trainer", *common, "--max-steps", str(args.steps),
               "--epochs", "1000", "--synthetic-samples", str(samples), "--no-eval",
               "--lr", "0.01"]  # fmt: skip
    baseline = [str(HERE / "baseline_ddp.py"), *common, "--steps", str(args.steps),
                "--samples", str(samples), "--lr", "0.01"]  # fmt: skip
    if args.gpu:
        trainer += ["--device", "cuda", "--precision", "bf16"]
        baseline += ["--device", "cuda", "--bf16"]
    variants = {
        "trainer": (trainer, TRAINER_DONE),
        "baseline": (baseline, BASELINE_DONE),
        "trainer, stop check every step": (trainer + ["--stop-check-every", "1"], TRAINER_DONE),
        "trainer, no stop check": (trainer + ["--stop-check-every", "1000000"], TRAINER_DONE),
    }
    mode = "GPU, NCCL, bf16" if args.gpu else f"CPU, gloo, {threads} thread(s) per rank"
    print(f"{nproc} rank(s), {mode}; model {args.model}, batch {args.batch_size}/rank, "
          f"{args.steps} steps, {args.reps} repetitions")  # fmt: skip
    if args.gpu:
        # GPU numbers mean little without the card and the library versions behind them.
        print(f"GPU {torch.cuda.get_device_name(0)}; torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}, NCCL {nccl_version()}")  # fmt: skip
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for rep in range(args.reps):
        for name, (target, pattern) in variants.items():
            results[name].append(parse(pattern, torchrun(nproc, target, threads)))
        line = ", ".join(f"{n} {results[n][-1][0]:.0f}" for n in variants)
        print(f"  rep {rep + 1}: samples/s {line}", flush=True)

    # Other load on the machine only ever slows a run down, so next to the median the
    # best repetition is the steadier estimate of what the code itself can do.
    summary = {}
    for name, runs in results.items():
        rates = [rate for rate, _ in runs]
        wait = statistics.median(share for _, share in runs)
        summary[name] = (statistics.median(rates), max(rates))
        print(
            f"{name:>30}: median {summary[name][0]:7.0f} samples/s, best {summary[name][1]:7.0f}, "
            f"data wait {wait:.1%} of step time"
        )
    for label, index in (("median", 0), ("best", 1)):
        ratio = summary["trainer"][index] / summary["baseline"][index]
        print(f"{label:>6}: trainer/baseline {ratio:.2f}x")
    # The stop check's cost: each repetition's checked run against the unchecked run of the
    # same repetition (they ran back to back), median over the repetitions.
    unchecked = [rate for rate, _ in results["trainer, no stop check"]]
    for name, label in (("trainer", "default (adaptive)"),
                        ("trainer, stop check every step", "every step")):  # fmt: skip
        ratios = [rate / base for (rate, _), base in zip(results[name], unchecked, strict=True)]
        median = statistics.median(ratios)
        print(
            f"stop check {label}: {median:.3f}x the throughput of no check, cost "
            f"{1 - median:+.1%} (median of {len(ratios)} paired repetitions)"
        )


if __name__ == "__main__":
    main()
