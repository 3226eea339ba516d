"""A busy start is never called unreachable: N namespace nodes x P ranks, every rank and every
torchrun importing torch on this machine's few cores at once, then one all_reduce over gloo.

    python benchmarks/busy_start.py [--nodes 16] [--nproc 2] [--repeat 1] [--apart yes|no]
    (as root: it builds a namespace cluster, tests/lab)

The agents' connection watch (orchestrator/agent/connects.py) calls a path unreachable when a
node's job keeps a TCP handshake unanswered for seconds; on a machine this loaded the store
and the ranks' listeners may be slow to accept, which must not read as a dropped path. Printed
per run: its end (state, exit code), seconds to the end, and every line the watch said
("cannot reach"); the target is none, every run succeeded. The path check is left out
(--no-path-check), so that the start is the job's own. The kernel's ARP table is shared by
every namespace of the machine: it is raised for the run (preflight_paths.arp_room).

From 32 nodes (or with --apart yes) the nodes run apart from the controller and share their
identical pages (common.lab_cluster's `apart`, as the other scale benchmarks do): every
process that imports torch keeps ~144 MB of its own, and 64 nodes x 2 ranks with their
torchruns (192 such processes) need more than this machine's 24 GiB unshared.
"""

from __future__ import annotations

import json
import subprocess
import time

from common import ORCHESTRATOR, lab_cluster, machine_line, parser, say, scratch
from common import table as text_table
from preflight_paths import arp_room

JOB = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
tensor = torch.ones(1)
dist.all_reduce(tensor)
print("reduced", tensor.item(), flush=True)
dist.destroy_process_group()
"""


def apart(choice: str, nodes: int) -> bool:
    return choice == "yes" or (choice == "auto" and nodes >= 32)


def main() -> int:
    args = parser(__doc__.splitlines()[0], "16", 1)
    args.add_argument("--nproc", type=int, default=2, help="ranks per node (2)")
    args.add_argument(
        "--apart", choices=("auto", "yes", "no"), default="auto",
        help="nodes apart from the controller, sharing pages (auto: from 32 nodes)",
    )  # fmt: skip
    args = args.parse_args()
    say(__doc__.split("\n\n", 1)[1].rstrip())
    say(machine_line())
    rows, bad = [], 0
    for n in args.nodes:
        with (
            arp_room(2 * (n * args.nproc) ** 2 + 4096),
            scratch("orchestrator-bench-busy-") as work,
            lab_cluster(n, plain_home=work / "home", apart=apart(args.apart, n)) as cluster,
        ):
            (work / "job.py").write_text(JOB)
            hostfile = cluster.write_hostfile(work / "hosts.txt", slots=args.nproc)
            for i in range(args.repeat):
                run_id = f"busy-{n}-{i}"
                argv = [*ORCHESTRATOR, "launch", str(hostfile), "--run-id", run_id,
                        "--run-dir", str(work / "runs"), "--color", "never",
                        "--no-path-check", "job.py"]  # fmt: skip
                began = time.monotonic()
                done = subprocess.run(
                    argv, env=cluster.environ(), cwd=work, capture_output=True, text=True,
                    timeout=1800,
                )  # fmt: skip
                took = time.monotonic() - began
                status = json.loads((work / "runs" / run_id / "status.json").read_text())
                said = [line for line in done.stdout.splitlines() if "cannot reach" in line]
                reduced = done.stdout.count(f"reduced {float(n * args.nproc)}")
                bad += done.returncode != 0 or bool(said)
                rows.append([n, args.nproc, status["state"], done.returncode, f"{took:.1f}",
                             len(said), "yes" if reduced else "no"])  # fmt: skip
                for line in said:
                    say(f"  {line}")
                say(f"{n} nodes, run {i + 1}: {status['state']} in {took:.1f} s")
    say(
        text_table(
            ["nodes", "ranks/node", "state", "exit", "seconds", "'cannot reach' lines",
             "all_reduce done"],
            rows,
        )
    )  # fmt: skip
    verdict = "met" if not bad else "NOT met"
    say(f"target: every run succeeded, none called unreachable: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
