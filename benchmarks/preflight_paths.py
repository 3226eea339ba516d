"""What the path check adds to the preflight: `launch --dry-run` (connect, probe, plan, render;
nothing starts) with the path check and with --no-path-check, on N namespace nodes.

The two contenders run interleaved (one of each, then the next repetition), so the machine's
load hits them alike; the baseline (--no-path-check) is measured in the same run. Printed per
node count: the whole command's wall time (median and range) for each, the difference of the
medians (what the path check adds), and the check's own time as it reports it ("paths: N TCP
connection(s) made in X s"). The nodes log in with a plain shell start-up (LAB.md, "Timing at
many nodes").

All pairs of n namespace nodes need n * (n - 1) ARP entries, and the kernel keeps one ARP table
for every namespace of the machine (net.ipv4.neigh.default.gc_thresh3, 1024 by default): past
it, "neighbor table overflow" and SYNs that never leave. A real node has its own table; the
lab raises the limit for the run and puts it back after.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from common import ORCHESTRATOR, lab_cluster, machine_line, median, parser, say, scratch, spread
from common import table as text_table

PATHS_NOTE = re.compile(r"paths: (\d+) TCP connection\(s\) made in ([\d.]+) s")


def dry_run(env: dict, hostfile, work, run_id: str, *extra: str) -> tuple[float, float | None, int]:
    """(wall seconds, the path check's own seconds or None, connections made)."""
    argv = [*ORCHESTRATOR, "launch", str(hostfile), "--dry-run", "--run-id", run_id,
            "--run-dir", str(work / "runs"), "--color", "never", *extra, "job.py"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
    found = PATHS_NOTE.search(done.stdout + done.stderr)
    return took, (float(found.group(2)) if found else None), int(found.group(1)) if found else 0


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
            with_check, without, own, made = [], [], [], 0
            for i in range(args.repeat):
                took, checked, made = dry_run(env, hostfile, work, f"with-{i}")
                with_check.append(took)
                own.append(checked or 0.0)
                without.append(dry_run(env, hostfile, work, f"without-{i}", "--no-path-check")[0])
        added = median(with_check) - median(without)
        rows.append(
            [n, made, spread(without), spread(with_check), f"{added:+.2f}", spread(own),
             f"{median(with_check) / median(without):.2f}x"]
        )  # fmt: skip
        say(f"{n} nodes done: +{added:.2f} s")
    say(
        text_table(
            ["nodes", "connections", "--no-path-check s", "with the check s", "added s (medians)",
             "check's own s", "ratio"],
            rows,
        )
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
