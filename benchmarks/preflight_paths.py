"""What the path check adds to the preflight: `launch --dry-run` (connect, probe, plan, render;
nothing starts) with the path check and with --no-path-check, on N namespace nodes.

Three contenders, interleaved (one of each, then the next repetition), so the machine's load
hits them alike: --no-path-check (the baseline); the check as the launch runs it, in the
probe's interpreter (orchestrator/nodes/paths/in_probe.py); and the check as a round of its own
through the node agents after the probe ("own round": the way it ran before the fold, and
still runs with spares; the controller is started with the fold turned off, nothing else
changed). Printed per node count: the whole command's wall time (median and range) for each,
the difference of the medians against the baseline (what each adds), and the own round's
time as it reports it ("paths: N TCP connection(s) made in X s"). Then each contender's
phases: seconds to the probe's end (the line naming the nodes' python and torch) and after
it, and the controller's CPU; with --profile, the nodes run in a cgroup of their own (one CPU
share: slower than without) and their CPU per node is printed too. The nodes log in with a
plain shell start-up (LAB.md, "Timing at many nodes").

All pairs of n namespace nodes need n * (n - 1) ARP entries, and the kernel keeps one ARP table
for every namespace of the machine (net.ipv4.neigh.default.gc_thresh3, 1024 by default): past
it, "neighbor table overflow" and SYNs that never leave. A real node has its own table; the
lab raises the limit for the run and puts it back after.
"""

from __future__ import annotations

import contextlib
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from common import ORCHESTRATOR, lab_cluster, machine_line, median, parser, say, scratch, spread
from common import table as text_table

PATHS_NOTE = re.compile(r"paths: (\d+) TCP connection\(s\) made (?:in ([\d.]+) s|by the probe)")
VERSIONS_NOTE = re.compile(r"node\(s\): .*python \S+, torch")
# The controller with the fold turned off: the check runs as a round of its own.
OWN_ROUND = [
    sys.executable,
    "-c",
    "import orchestrator.start.preflight as p; p.fold_paths = lambda pool, spec: None; "
    "from orchestrator.cli import main; main()",
]


@dataclass
class Took:
    wall: float  # the whole command's seconds
    own: float | None  # the own round's seconds as it reports them (None: in the probe)
    made: int  # connections made
    probed: float  # seconds to the probe's end (its versions line)
    nodes_cpu: float | None  # the nodes' CPU seconds (--profile: their cgroup's account)
    controller_cpu: float  # the controller's CPU seconds


def dry_run(
    env: dict, hostfile, work, run_id: str, *extra: str, controller: list[str] = ORCHESTRATOR,
    group=None,
) -> Took:  # fmt: skip
    argv = [*controller, "launch", str(hostfile), "--dry-run", "--run-id", run_id,
            "--run-dir", str(work / "runs"), "--color", "never", *extra, "job.py"]  # fmt: skip
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    nodes_before = group.cpu_seconds() if group is not None else None
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        env={**env, "PYTHONUNBUFFERED": "1"},  # each line as it is said
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in proc.stdout:  # when each line came: the phases' ends
        lines.append((time.monotonic() - started, line))
    proc.wait(timeout=600)
    took = time.monotonic() - started
    text = "".join(line for _, line in lines)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{text}")
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    probed = next((t for t, line in lines if VERSIONS_NOTE.search(line)), took)
    found = PATHS_NOTE.search(text)
    return Took(
        took,
        float(found.group(2)) if found and found.group(2) else None,
        int(found.group(1)) if found else 0,
        probed,
        group.cpu_seconds() - nodes_before if group is not None else None,
        cpu.ru_utime + cpu.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime,
    )


@contextlib.contextmanager
def arp_room(entries: int) -> Iterator[None]:
    """The machine's ARP table (shared by every namespace) holds `entries` more for a while."""
    names = [Path(f"/proc/sys/net/ipv4/neigh/default/gc_thresh{i}") for i in (2, 3)]
    before = [int(p.read_text()) for p in names]
    try:
        for path, value in zip(names, before, strict=True):
            path.write_text(str(max(value, value + entries)))
        yield
    finally:
        for path, value in zip(reversed(names), reversed(before), strict=True):
            path.write_text(str(value))


CONTENDERS = ("--no-path-check", "in the probe", "own round")


def main() -> int:
    args = parser(__doc__.splitlines()[0], "16,64", 5)
    args.add_argument(
        "--profile", action="store_true",
        help="the nodes in a cgroup of their own, for their CPU; print each contender's phases",
    )  # fmt: skip
    args = args.parse_args()
    say(__doc__.split("\n\n", 1)[1].rstrip())
    say(machine_line())
    rows, phases = [], []
    for n in args.nodes:
        with (
            arp_room(2 * n * n + 4096),  # other labs on this machine use the table too
            scratch("orchestrator-bench-paths-") as work,
            lab_cluster(n, plain_home=work / "home") as cluster,
        ):
            if args.profile:
                say(cluster.confine(cluster.nodes))
            group = cluster.apart if args.profile else None
            (work / "job.py").write_text("print('hello')\n")
            hostfile = cluster.write_hostfile(work / "hosts.txt", slots=1)
            env = cluster.environ()
            dry_run(env, hostfile, work, "warm", "--no-path-check")  # page cache, sshd keys
            runs: dict[str, list[Took]] = {name: [] for name in CONTENDERS}
            for i in range(args.repeat):
                runs["in the probe"].append(dry_run(env, hostfile, work, f"with-{i}", group=group))
                if runs["in the probe"][-1].own is not None:
                    raise SystemExit(f"{n} nodes: the check did not ride on the probe")
                runs["own round"].append(
                    dry_run(env, hostfile, work, f"own-{i}", controller=OWN_ROUND, group=group)
                )
                runs["--no-path-check"].append(
                    dry_run(env, hostfile, work, f"without-{i}", "--no-path-check", group=group)
                )
        wall = {name: [t.wall for t in took] for name, took in runs.items()}
        base = median(wall["--no-path-check"])
        added = median(wall["in the probe"]) - base
        before = median(wall["own round"]) - base
        rows.append(
            [n, runs["in the probe"][0].made, spread(wall["--no-path-check"]),
             spread(wall["in the probe"]), f"{added:+.2f}", spread(wall["own round"]),
             f"{before:+.2f}", spread([t.own or 0.0 for t in runs["own round"]]),
             f"{median(wall['in the probe']) / median(wall['own round']):.2f}x"]
        )  # fmt: skip
        for name, took in runs.items():
            nodes_cpu = [t.nodes_cpu for t in took if t.nodes_cpu is not None]
            phases.append(
                [n, name, spread([t.probed for t in took]),
                 spread([t.wall - t.probed for t in took]),
                 f"{median(nodes_cpu) * 1e3 / n:.0f}" if nodes_cpu else "-",
                 f"{median([t.controller_cpu for t in took]):.2f}"]
            )  # fmt: skip
        say(f"{n} nodes done: +{added:.2f} s in the probe, +{before:.2f} s as its own round")
    say(
        text_table(
            ["nodes", "connections", "--no-path-check s", "in the probe s", "added s",
             "own round s", "added s", "own round's own s", "probe / own round"],
            rows,
        )
    )  # fmt: skip
    say(
        text_table(
            ["nodes", "contender", "to the probe's end s", "after it s", "nodes' CPU ms/node",
             "controller CPU s"],
            phases,
        )
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
