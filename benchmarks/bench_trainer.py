"""Throughput of the bundled trainer against a plain hand-written DDP loop.

Both run under real torchrun with the same model, synthetic data, per-rank batch size,
number of ranks and steps; repetitions alternate between them so machine load drifts
affect both alike. Prints the median and best samples/s of each, their ratios, and the
share of step time each spent waiting for data. Two more trainer variants check for a stop
signal every step, or never, to show what the default adaptive check costs: each checked
run against the unchecked run of the same repetition, median over the repetitions. Two last
variants start each rank through the same shell wrapper, one setting the orchestrator's
metrics channel (ORCHESTRATOR_METRICS_FILE, one file per rank) and one not, and are paired
the same way: the channel must cost at most 2 %.

    python benchmarks/bench_trainer.py                 # CPU, 2 ranks, gloo
    python benchmarks/bench_trainer.py --gpu           # 1 GPU, NCCL, bf16, pinned memory
    python benchmarks/bench_trainer.py --channel-only --reps 9   # the channel's cost alone

Throughput counts the training loop only (process start and torch import excluded).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAINER_DONE = re.compile(r"^done: .*?, ([\d.]+) samples/s, data wait ([\d.]+)%", re.M)
BASELINE_DONE = re.compile(r"^baseline done: .*?, ([\d.]+) samples/s, data wait ([\d.]+)%", re.M)


CHANNEL = "ORCHESTRATOR_METRICS_FILE"


def torchrun(nproc: int, target: list[str], threads: int, channel: bool | None = None) -> str:
    """Run ``target`` on ``nproc`` ranks.

    With ``channel`` True or False each rank starts through a shell, which sets (True) or
    leaves unset (False) a metrics file of its own: torchrun gives all ranks one
    environment. Both go through the shell so that the pair differs in the channel alone.
    """
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop(CHANNEL, None)
    with tempfile.TemporaryDirectory() as directory:
        wrapper: list[str] = []
        if channel is not None:
            setting = f'{CHANNEL}="$0/metrics-$RANK.jsonl" ' if channel else ""
            script = f'{setting}exec {shlex.quote(sys.executable)} "$@"'
            wrapper = ["--no-python", "bash", "-c", script, directory]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", *wrapper, *target]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if result.returncode != 0:
            sys.exit(f"benchmark run failed ({' '.join(cmd)}):\n{result.stdout}\n{result.stderr}")
        if channel:
            written = [Path(directory, f"metrics-{rank}.jsonl") for rank in range(nproc)]
            if not all(path.exists() and path.stat().st_size for path in written):
                sys.exit(f"the channel variant wrote no records:\n{result.stderr}")
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
    parser.add_argument(
        "--channel-only", action="store_true",
        help="run only the trainer with and without ORCHESTRATOR_METRICS_FILE",
    )  # fmt: skip
    parser.add_argument(
        "--skip-channel", action="store_true",
        help="leave out the metrics channel pair (a third fewer runs)",
    )  # fmt: skip
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
    # name: (command, its summary line, None or whether the shell wrapper sets the channel)
    variants: dict[str, tuple[list[str], re.Pattern[str], bool | None]] = {
        "trainer": (trainer, TRAINER_DONE, None),
        "baseline": (baseline, BASELINE_DONE, None),
        "trainer, stop check every step": (
            trainer + ["--stop-check-every", "1"], TRAINER_DONE, None,
        ),
        "trainer, no stop check": (trainer + ["--stop-check-every", "1000000"], TRAINER_DONE, None),
        "trainer, no metrics channel": (trainer, TRAINER_DONE, False),
        "trainer, metrics channel": (trainer, TRAINER_DONE, True),
    }  # fmt: skip
    if args.channel_only:
        variants = {n: v for n, v in variants.items() if v[2] is not None}
    elif args.skip_channel:
        variants = {n: v for n, v in variants.items() if v[2] is None}
    mode = "GPU, NCCL, bf16" if args.gpu else f"CPU, gloo, {threads} thread(s) per rank"
    print(f"{nproc} rank(s), {mode}; model {args.model}, batch {args.batch_size}/rank, "
          f"{args.steps} steps, {args.reps} repetitions")  # fmt: skip
    if args.gpu:
        # GPU numbers mean little without the card and the library versions behind them.
        print(f"GPU {torch.cuda.get_device_name(0)}; torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}, NCCL {nccl_version()}")  # fmt: skip
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for rep in range(args.reps):
        # Every other repetition in reverse, so neither side of a pair always runs first.
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for name in order:
            target, pattern, channel = variants[name]
            results[name].append(parse(pattern, torchrun(nproc, target, threads, channel)))
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
    if args.channel_only:
        channel_cost(results)
        return
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
    if not args.skip_channel:
        channel_cost(results)


def channel_cost(results: dict[str, list[tuple[float, float]]]) -> None:
    """The metrics channel's cost, paired like the stop check's: it may take 2 % at most."""
    with_channel = [rate for rate, _ in results["trainer, metrics channel"]]
    without = [rate for rate, _ in results["trainer, no metrics channel"]]
    ratios = [a / b for a, b in zip(with_channel, without, strict=True)]
    median = statistics.median(ratios)
    verdict = "within" if median >= 0.98 else "NOT within"
    # The middle half of the pairs: where it is wider than 2 %, so is the verdict's doubt.
    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (median,) * 3
    print(
        f"metrics channel: {median:.3f}x the throughput without it, cost {1 - median:+.1%}, "
        f"{verdict} 2 % (median of {len(ratios)} paired repetitions, middle half "
        f"{low:.3f} to {high:.3f}: {', '.join(f'{r:.3f}' for r in ratios)})"
    )


if __name__ == "__main__":
    main()
