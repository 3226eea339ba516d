"""What a quiet job costs while it runs: CPU of each node agent, of torchrun, and of the controller.

N namespace nodes (default 4), one rank per node that prints a line and sleeps. Once every
rank runs, the CPU time (user + system, from /proc/PID/stat) of each node's agent, of each
node's torchrun (its elastic agent, which watches its workers: the baseline, in the same run
on the same nodes) and of the controller is read, and again --seconds later (default 60).
Printed: milliseconds of CPU per minute, median over the nodes, and the agent's ratio to
torchrun's. Tasks that only wait cost nothing; what is left is the waking up.
"""

from __future__ import annotations

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


def main() -> int:
    cli = parser(__doc__.splitlines()[0], "4", 1)
    cli.add_argument("--seconds", type=float, default=60, help="the window measured (60)")
    args = cli.parse_args()
    say(__doc__.split("\n\n", 1)[1].rstrip())
    say(machine_line())
    from tests.lab import bad_days

    n, window = args.nodes[0], args.seconds
    with (
        scratch("orchestrator-bench-idle-") as work,
        lab_cluster(n) as cluster,
        sleeping_job(cluster, work, window + 60) as controller,
    ):
        agents = [bad_days.agent_pids(cluster, node, "idle")[0] for node in cluster.nodes]
        torchruns = [
            p.pid
            for node in cluster.nodes
            for p in cluster.processes_on(node)
            if "torch.distributed.run" in p.cmdline
        ]
        pids = {"agent": agents, "torchrun": torchruns, "controller": [controller.pid]}
        before = {k: [cpu_seconds(p) for p in v] for k, v in pids.items()}
        time.sleep(window)
        after = {k: [cpu_seconds(p) for p in v] for k, v in pids.items()}
    per_minute = {
        k: [(a - b) * 1000 * 60 / window for a, b in zip(after[k], before[k], strict=True)]
        for k in pids
    }
    rows = [
        [k, len(v), f"{median(v):.0f}", f"{min(v):.0f}-{max(v):.0f}"] for k, v in per_minute.items()
    ]
    say(table(["process", "count", "CPU ms/min (median)", "range"], rows))
    ratio = median(per_minute["agent"]) / max(median(per_minute["torchrun"]), 1e-9)
    say(
        f"{n} nodes, {window:g} s: an idle agent costs {median(per_minute['agent']):.0f} ms of "
        f"CPU per minute, {ratio:.2f}x its node's torchrun; the controller "
        f"{median(per_minute['controller']):.0f} ms per minute ({n} nodes)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
