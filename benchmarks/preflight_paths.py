"""What the path check adds to the preflight: `launch --dry-run` (connect, probe, plan, render;
nothing starts) with the path check and with --no-path-check, on N namespace nodes.

Three contenders, interleaved (one of each, then the next repetition), so the machine's load
hits them alike: --no-path-check (the baseline); the check as the launch runs it, in the
probe's interpreter (orchestrator/nodes/paths/in_probe.py); and the check as a round of its own
through the node agents after the probe (`--own-round`: the way it ran before the fold, and
still runs with spares; the controller is started with the fold turned off, nothing else
changed). Printed per node count: the whole command's wall time (median and range) for each,
the difference of the medians against the baseline (what each adds), and the own round's
time as it reports it ("paths: N TCP connection(s) made in X s"). The nodes log in with a
plain shell start-up (LAB.md, "Timing at many nodes").

All pairs of n namespace nodes need n * (n - 1) ARP entries, and the kernel keeps one ARP table
for every namespace of the machine (net.ipv4.neigh.default.gc_thresh3, 1024 by default): past
it, "neighbor table overflow" and SYNs that never leave. A real node has its own table; the
lab raises the limit for the run and puts it back after.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from common import ORCHESTRATOR, lab_cluster, machine_line, median, parser, say, scratch, spread
from common import table as text_table

PATHS_NOTE = re.compile(r"paths: (\d+) TCP connection\(s\) made (?:in ([\d.]+) s|by the probe)")
# The controller with the fold turned off: the check runs as a round of its own.
OWN_ROUND = [
    sys.executable,
    "-c",
    "import orchestrator.start.preflight as p; p.fold_paths = lambda pool, spec: None; "
    "from orchestrator.cli import main; main()",
]


def dry_run(
    env: dict, hostfile, work, run_id: str, *extra: str, controller: list[str] = ORCHESTRATOR
) -> tuple[float, float | None, int]:
    """(wall seconds, the path check's own round's seconds or None, connections made)."""
    argv = [*controller, "launch", str(hostfile), "--dry-run", "--run-id", run_id,
            "--run-dir", str(work / "runs"), "--color", "never", *extra, "job.py"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
    found = PATHS_NOTE.search(done.stdout + done.stderr)
    own = float(found.group(2)) if found and found.group(2) else None
    return took, own, int(found.group(1)) if found else 0


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


def main() -> int:
    args = parser(__doc__.splitlines()[0], "16,64", 5).parse_args()
    say(__doc__.split("\n\n", 1)[1].rstrip())
    say(machine_line())
    rows = []
    for n in args.nodes:
        with (
            arp_room(2 * n * n + 4096),  # other labs on this machine use the table too
            scratch("orchestrator-bench-paths-") as work,
            lab_cluster(n, plain_home=work / "home") as cluster,
        ):
            (work / "job.py").write_text("print('hello')\n")
            hostfile = cluster.write_hostfile(work / "hosts.txt", slots=1)
            env = cluster.environ()
            dry_run(env, hostfile, work, "warm", "--no-path-check")  # page cache, sshd keys
            folded, round_, without, own, made = [], [], [], [], 0
            for i in range(args.repeat):
                took, checked, made = dry_run(env, hostfile, work, f"with-{i}")
                if checked is not None:
                    raise SystemExit(f"{n} nodes: the check did not ride on the probe")
                folded.append(took)
                took, checked, _ = dry_run(env, hostfile, work, f"own-{i}", controller=OWN_ROUND)
                round_.append(took)
                own.append(checked or 0.0)
                without.append(dry_run(env, hostfile, work, f"without-{i}", "--no-path-check")[0])
        added = median(folded) - median(without)
        before = median(round_) - median(without)
        rows.append(
            [n, made, spread(without), spread(folded), f"{added:+.2f}", spread(round_),
             f"{before:+.2f}", spread(own), f"{median(folded) / median(round_):.2f}x"]
        )  # fmt: skip
        say(f"{n} nodes done: +{added:.2f} s in the probe, +{before:.2f} s as its own round")
    say(
        text_table(
            ["nodes", "connections", "--no-path-check s", "in the probe s", "added s",
             "own round s", "added s", "own round's own s", "probe / own round"],
            rows,
        )
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
