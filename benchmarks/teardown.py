"""Teardown: from the failing rank's exit until the last process of the run is gone everywhere.

    python benchmarks/teardown.py [--nodes 3,8] [--repeat 3] [--grace 3]   (as root: it
    builds a namespace cluster of N nodes with sshd for each node count, see tests/lab)

A torchrun job, one rank per node (`orchestrator launch`, defaults but --grace). Every
rank marks itself ready in a shared directory and sleeps; once all are ready, the last
rank writes time.time() to a file and exits with code 3. From outside, a poller scans the
process table (the lab's nodes share this machine's pid namespace) for processes whose
environment has ORCHESTRATOR_RUN_ID=<run id> (agents, node scripts, torchrun, ranks) until
none is left. Timed: the first scan that finds none (its end) - the failing rank's stamp.
Cases:
  all exit on SIGTERM   every other rank ends on the stop's SIGTERM. Target: < 2 s.
  one ignores SIGTERM   rank 0 ignores SIGTERM, so its agent must SIGKILL it after the
                        grace. Target: the grace + < 2 s (so about the grace, not more).
"Controller exit" = the `orchestrator launch` process's exit - the failing rank's stamp.
"""

from __future__ import annotations

import itertools
import subprocess
import time
from pathlib import Path

from common import (
    ORCHESTRATOR,
    lab_cluster,
    machine_line,
    median,
    parser,
    remove_node_dirs,
    say,
    scratch,
    spread,
    table,
    wait_until,
)

from tests.cli_helpers import run_pids

RANK_PROGRAM = """\
import os, signal, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
shared = {shared!r}
if rank == {ignoring}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(shared, f"ready-{{rank}}"), "w").close()
if rank == world - 1:
    while sum(name.startswith("ready-") for name in os.listdir(shared)) < world:
        time.sleep(0.01)
    time.sleep(0.5)  # let every node settle in its sleep
    with open(os.path.join(shared, "failed"), "w") as stamp:
        stamp.write(f"{{time.time():.6f}}\\n")
    os._exit(3)
while True:
    time.sleep(1)
"""

RUNS = itertools.count()


def one_run(
    cluster,
    work: Path,
    hostfile: Path,
    n: int,
    grace: float,
    ignoring: int | None,
    run_ids: list[str],
) -> tuple[float, float, float]:
    """(teardown s, controller exit s, scan s) of one failing run."""
    run_id = f"bench-teardown-{next(RUNS)}"
    run_ids.append(run_id)
    shared = work / run_id
    shared.mkdir()
    program = work / f"{run_id}.py"
    program.write_text(
        RANK_PROGRAM.format(shared=str(shared), ignoring=-1 if ignoring is None else ignoring)
    )
    argv = [
        *ORCHESTRATOR,
        "launch",
        str(hostfile),
        "--run-dir",
        str(work / "runs"),
        "--run-id",
        run_id,
        "--color",
        "never",
        "--grace",
        f"{grace:g}",
        "--",
        program.name,
    ]
    proc = subprocess.Popen(
        argv,
        cwd=work,
        env=cluster.environ(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: len(list(shared.glob("ready-*"))) == n or proc.poll() is not None,
            300,
            "every rank to start",
        )
        if proc.poll() is not None:
            raise RuntimeError(f"launch ended early ({proc.returncode}): {proc.stderr.read()}")
        scans, gone, exited = [], None, None
        deadline = time.time() + 120
        while gone is None or exited is None:  # until no process is left and launch is done
            began = time.time()
            left = run_pids(run_id) if gone is None else []
            ended = time.time()
            if gone is None:
                scans.append(ended - began)
                if not left and (shared / "failed").exists():
                    gone = ended
            if exited is None and proc.poll() is not None:
                exited = ended
            if ended - began < 0.005:
                time.sleep(0.005)
            if ended > deadline:
                raise RuntimeError(f"run {run_id} still has processes after 120 s")
    finally:
        if proc.poll() is None:
            proc.kill()
    failed_at = float((shared / "failed").read_text())
    if proc.returncode != 3:
        raise RuntimeError(
            f"launch exited {proc.returncode}, not the failing rank's 3: "
            f"{proc.stderr.read()[-500:]}"
        )
    return gone - failed_at, exited - failed_at, median(scans)


def main() -> None:
    cli = parser(__doc__.splitlines()[0], "3,8", 3)
    cli.add_argument("--grace", type=float, default=3.0, help="--grace of the runs (default 3 s)")
    args = cli.parse_args()
    say(__doc__.split("\n\n", 2)[2].rstrip())
    say(machine_line())
    say(f"repetitions per case: {args.repeat}; --grace {args.grace:g}")
    rows = []
    for n in args.nodes:
        with lab_cluster(n) as cluster, scratch("orchestrator-bench-teardown-") as work:
            hostfile = cluster.write_hostfile(work / "hosts.txt", slots=1)
            cases = {"all exit on SIGTERM": None, "one ignores SIGTERM": 0}
            results: dict[str, list[tuple[float, float, float]]] = {c: [] for c in cases}
            run_ids: list[str] = []
            try:
                for _ in range(args.repeat):
                    for case, ignoring in cases.items():
                        results[case].append(
                            one_run(cluster, work, hostfile, n, args.grace, ignoring, run_ids)
                        )
            finally:
                remove_node_dirs(run_ids)
            for case, found in results.items():
                target = 2.0 + (args.grace if cases[case] is not None else 0.0)
                teardown = [r[0] for r in found]
                rows.append(
                    [
                        n,
                        case,
                        spread(teardown),
                        spread([r[1] for r in found]),
                        f"< {target:g}",
                        "met" if median(teardown) < target else "MISSED",
                        f"{median([r[2] for r in found]) * 1000:.0f} ms",
                    ]
                )
    say("")
    say(table(["nodes", "case", "teardown s", "controller exit s", "target s", "", "scan"], rows))
    say(
        "median (min-max) over the repetitions; scan = median duration of one process-table "
        "scan (the resolution)"
    )


if __name__ == "__main__":
    main()
