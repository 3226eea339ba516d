"""What the controller costs while its job runs and prints nothing, at 16 to 250 nodes.

    python benchmarks/idle_controller.py [--nodes 16,64,250] [--repeat 3] [--seconds 30]
    (as root: it builds a namespace cluster of N nodes with sshd per node count, tests/lab)

For each node count: `orchestrator launch` of a job whose one rank per node prints a line
and sleeps; once every rank has printed and the start's load has passed (--settle), the
controller's CPU time (user + system, all its threads, from /proc) is read at the start
and end of each of --repeat windows of --seconds. Printed: CPU ms per window (median of
the windows) and per node, and each node count's per-node figure against the smallest
count's in the same run (flat: 1.0x or less). Target: at most 2 ms of CPU per node per
30 s. The nodes' own CPU is not counted (see benchmarks/idle_agent.py for an agent's);
their login shells start with empty start-up files.
Memory: each node's torchrun keeps ~150 MB of its own (torch imported), but the nodes share
their identical pages (benchmarks/common.lab_cluster, tests/lab/pages.py): 256 nodes ran
here in ~10 GB without swap (the start took 825 s). The kernel's merging thread (ksmd)
would go on scanning the nodes' memory all the while (about 40 % of a core at 256 nodes),
a cost no real cluster's controller shares: so the windows run twice, first with ksmd
scanning, then with it paused (the pages merged so far stay merged); the target is read
from the paused ones, the controller's own cost.
"""

from __future__ import annotations

import os
import time

from common import (
    cpu_seconds,
    lab_cluster,
    machine_line,
    median,
    parser,
    say,
    scratch,
    sleeping_job,
    table,
)


def settle(limit: float) -> None:
    """Wait (up to `limit` s) for the start's load to pass: the 1-minute load average
    below the core count. Hundreds of torchruns starting at once load this machine for
    minutes after the last rank runs, and a controller measured then pays for it."""
    deadline, cores = time.monotonic() + limit, os.cpu_count() or 1
    while os.getloadavg()[0] > cores and time.monotonic() < deadline:
        time.sleep(5)
    say(f"  measuring at load average {os.getloadavg()[0]:.1f}")


def main() -> int:
    cli = parser(__doc__.splitlines()[0], "16,64,250", 3)
    cli.add_argument("--seconds", type=float, default=30, help="one window (30)")
    cli.add_argument(
        "--settle",
        type=float,
        default=600,
        help="seconds to wait at most for the load average to fall below the cores (600)",
    )
    args = cli.parse_args()
    from tests.lab import pages  # after common, which puts the repository on sys.path

    say(machine_line())
    window = args.seconds
    scanning: dict[int, list[float]] = {}
    paused: dict[int, list[float]] = {}
    for n in args.nodes:
        with (
            scratch("orchestrator-bench-idlectl-") as work,
            lab_cluster(n, plain_home=work / "home", apart=True) as cluster,
        ):
            started = time.monotonic()
            # Ranks sleep past the slowest start (a 250-node start can take many minutes
            # here); the job is stopped once measured.
            with sleeping_job(cluster, work, args.repeat * window + 1800) as controller:
                say(f"{n} nodes: every rank runs after {time.monotonic() - started:.0f} s")
                settle(args.settle)
                say("  ksmd scanning:")
                scanning[n] = windows(controller.pid, args.repeat, window)
                with pages.paused() as stopped:
                    say("  ksmd paused:" if stopped else "  (ksmd was not running)")
                    paused[n] = windows(controller.pid, args.repeat, window)
    for title, results in (("ksmd scanning", scanning), ("ksmd paused", paused)):
        smallest = min(results)
        base = median(results[smallest]) / smallest
        rows = []
        for n, spent in results.items():
            per_node = median(spent) / n
            rows.append(
                [
                    n,
                    f"{median(spent):.0f} ({min(spent):.0f}-{max(spent):.0f})",
                    f"{per_node:.2f}",
                    f"{per_node / base:.2f}x" if base > 0 else "-",
                ]
            )
        say(f"\n{title}")
        say(
            table(
                [
                    "nodes",
                    f"controller CPU ms per {window:g} s",
                    f"ms per node per {window:g} s",
                    f"per node vs {smallest} nodes",
                ],
                rows,
            )
        )
    return 0


def windows(pid: int, repeat: int, window: float) -> list[float]:
    """The controller's CPU ms in each of `repeat` windows of `window` s."""
    spent = []
    for _ in range(repeat):
        before = cpu_seconds(pid)
        time.sleep(window)
        spent.append((cpu_seconds(pid) - before) * 1000)
        load = os.getloadavg()[0]
        say(f"    {spent[-1]:.0f} ms of CPU in {window:g} s (load average {load:.1f})")
    return spent


if __name__ == "__main__":
    raise SystemExit(main())
