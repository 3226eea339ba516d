"""The console's cost per line on the controller, folded (the default) and not, in process.

    python benchmarks/console_cost.py [--ranks 4] [--lines 50000] [--chunk 200] [--repeat 5]

The run's LogSink as `launch` makes it (no run files: the console path alone, into memory),
fed chunks of `--chunk` distinct lines from each of `--ranks` ranks in turn, with the
console's flush after each round, as the supervision loop does. Printed: CPU microseconds
per line, folded and with --no-fold (median of --repeat, alternated), and their ratio.
benchmarks/log_throughput.py shows what it does to a whole launch.
"""

from __future__ import annotations

import argparse
import io
import time

from common import machine_line, median, say, table

from orchestrator.console.sink import LogSink


def cost_per_line(fold: bool, ranks: int, lines: int, chunk: int) -> float:
    clock = [0.0]
    sink = LogSink(
        None,
        {r: f"node{r} r{r}" for r in range(ranks)},
        {r: f"node{r}" for r in range(ranks)},
        io.BytesIO(),
        False,
        fold=fold,
        clock=lambda: clock[0],
    )
    chunks = {
        r: [
            b"".join(b"R%d #%d %s\n" % (r, i + k, b"x" * 60) for k in range(chunk))
            for i in range(0, lines, chunk)
        ]
        for r in range(ranks)
    }
    began = time.process_time()
    for round_ in range(lines // chunk):
        for rank in range(ranks):
            sink.rank_output(rank, chunks[rank][round_])
        clock[0] += 0.01  # each round 10 ms later: lines leave the fold window as they would
        sink.flush()
    sink.close()
    return (time.process_time() - began) / (ranks * lines) * 1e6


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--ranks", type=int, default=4)
    cli.add_argument("--lines", type=int, default=50_000, help="lines per rank")
    cli.add_argument("--chunk", type=int, default=200, help="lines per chunk of a rank")
    cli.add_argument("--repeat", type=int, default=5)
    args = cli.parse_args()
    say(machine_line())
    folded, plain = [], []
    for _ in range(args.repeat):
        folded.append(cost_per_line(True, args.ranks, args.lines, args.chunk))
        plain.append(cost_per_line(False, args.ranks, args.lines, args.chunk))
    rows = [
        ["folded (default)", f"{median(folded):.2f}"],
        ["--no-fold", f"{median(plain):.2f}"],
    ]
    say(table(["console", "CPU us per line"], rows))
    say(f"folding costs {median(folded) / median(plain):.0f}x the unfolded console per line")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
