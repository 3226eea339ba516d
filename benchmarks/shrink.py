"""Fewer nodes (--min-nodes) vs a spare (--spares): from a node's fault to training again.

4 namespace nodes, the bundled trainer with a checkpoint every 10 steps, 3 nodes running
in both launches. Spare path (today's): `--spares 1`, the 4th node held back. Shrink path:
`--min-nodes 2`, no spare; the run goes on with the 2 nodes left. Once the first checkpoint
is written, the same node (--victim, default 0: the master, whose store and node rank move)
is switched off (link down, every process SIGKILLed). The controller's console lines,
time-stamped as they arrive, split the time from the fault to rank 0's first step after
resume into:

  detection  fault -> "NODE: lost" (the heartbeat timeout bounds it)
  stop       -> attempt 1 has ended on every node (the others stopped, SIGKILL after --grace)
  re-probe   -> attempt 2 starts (the nodes probed again, plan, scripts)
  restart    -> every node of attempt 2 runs (status.json: running_again_at / world's running_at)
  resume     -> rank 0's first step after resume (torch import, rendezvous, checkpoint load)

Both paths run in the same invocation, alternately, on the same lab; the ratio is the
shrink's median total over the spare's. Medians (min-max) of --repeat runs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from common import (
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
from recovery import PHASES, Console, _wall, fault_phases, launch_argv


def one_fault(cluster, work: Path, run_id: str, victim_rank: int, heartbeat: float, shrink: bool):
    from tests.lab import bad_days

    ckpt = work / f"ckpt-{run_id}"
    if shrink:  # the first 3 nodes, no spare; the run may go on with 2
        hostfile = cluster.write_hostfile(work / "hosts-3.txt", cluster.nodes[:3], slots=1)
        extra = ("--min-nodes", "2")
    else:  # the same 3 nodes running, the 4th held back as the spare
        hostfile = cluster.write_hostfile(work / "hosts-4.txt", slots=1)
        extra = ("--spares", "1")
    victim = cluster.nodes[victim_rank]
    console = Console(
        launch_argv(hostfile, work / "runs", run_id, ckpt, heartbeat, *extra),
        work,
        cluster.environ(),
    )
    try:
        wait_until(lambda: any(ckpt.glob("ckpt-*.pt")), 300, "the first checkpoint", poll=0.05)
        with bad_days.powered_off(cluster, victim):
            off = time.time()
            code = console.wait(timeout=600)
    finally:
        if console.proc.poll() is None:
            console.proc.kill()
    text = "\n".join(line for _, line in console.lines)
    if code != 0:
        raise SystemExit(f"{run_id} failed (exit {code}):\n{text[-3000:]}")
    status = json.loads((work / "runs" / run_id / "status.json").read_text())
    nodes = [len(entry["nodes"]) for entry in status["world"]]
    if nodes != ([3, 2] if shrink else [3, 3]):
        raise SystemExit(f"{run_id}: the world went {nodes}:\n{text[-3000:]}")
    phases = fault_phases(console, victim.name, off, _wall(status["world"][1]["running_at"]), text)
    remove_node_dirs([run_id])
    return phases


def main() -> int:
    cli = parser(__doc__.splitlines()[0], "4", 3)
    cli.add_argument("--heartbeat-timeout", type=float, default=10, help="the launch's (10 s)")
    cli.add_argument("--victim", type=int, default=0, help="the node rank switched off (0)")
    args = cli.parse_args()
    say(__doc__.split("\n\n", 1)[1].rstrip())
    say(machine_line())
    paths: dict[str, list[dict[str, float]]] = {"spare": [], "shrink": []}
    with scratch("orchestrator-bench-shrink-") as work, lab_cluster(args.nodes[0]) as cluster:
        for rep in range(args.repeat):
            for name in ("spare", "shrink"):
                run_id = f"{name}-{rep}"
                result = one_fault(
                    cluster, work, run_id, args.victim, args.heartbeat_timeout, name == "shrink"
                )
                paths[name].append(result)
                say(f"{run_id}: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.items()))
    rows = [
        [
            phase,
            spread([r[phase] for r in paths["spare"]]),
            spread([r[phase] for r in paths["shrink"]]),
        ]
        for phase in (*PHASES, "total")
    ]
    say(table(["from the fault", "spare: median (min-max)", "shrink: median (min-max)"], rows))
    spare = median([r["total"] for r in paths["spare"]])
    shrink = median([r["total"] for r in paths["shrink"]])
    say(
        f"fault to training again: shrink {shrink:.1f} s, spare {spare:.1f} s: "
        f"{shrink / spare:.2f}x (heartbeat timeout {args.heartbeat_timeout:g} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
