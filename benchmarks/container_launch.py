"""What a container costs a launch: the same job on the same nodes, with and without
`--container` (podman), the image holding the very interpreter and environment the nodes run
without it.

    python benchmarks/container_launch.py [--nodes 16] [--repeat 3]
    (as root: it builds a namespace cluster of N nodes with sshd and podman, tests/lab, and
    the lab's image, tests/lab/containers.py, about two minutes the first time)

One rank per node; each rank stamps its start (time.time(), before importing torch) into a
shared file, then imports torch, joins a gloo process group, all_reduces one tensor and
exits 0. "All started" = the latest rank stamp - the launch's start (preflight, node
scripts, and for the container: the probe's look inside the image and each node's
`podman run`); "finished" = the launch's exit - its start. The two alternate (rotating
order per repetition); printed: medians (min-max) and the ratio with/without. The benchmark
passes (exit 0) when every launch exited 0 and every rank started.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    ORCHESTRATOR,
    machine_line,
    median,
    parser,
    ratio,
    read_stamps,
    remove_node_dirs,
    say,
    scratch,
    spread,
    table,
)

RANK_PROGRAM = """\
import os, time
with open({stamps!r}, "a") as f:
    f.write(f"{{os.environ['RANK']}} {{time.time()}}\\n")
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
assert total.item() == dist.get_world_size()
dist.destroy_process_group()
"""


@dataclass
class Way:
    name: str
    flags: tuple[str, ...]
    started: list[float] = field(default_factory=list)
    finished: list[float] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)


def main() -> int:
    cli = parser(__doc__.splitlines()[0], "16", 3)
    args = cli.parse_args()
    say(machine_line())
    from tests.lab import LabUnavailable, make_cluster
    from tests.lab.containers import ensure_image

    passed = True
    for n in args.nodes:
        with scratch("orchestrator-bench-container-") as work, contextlib.ExitStack() as stack:
            try:
                began = time.monotonic()
                image = ensure_image()
                say(f"image {image} ready in {time.monotonic() - began:.1f} s")
                cluster = stack.enter_context(make_cluster(n, containers=True))
            except LabUnavailable as exc:
                raise SystemExit(f"cannot build the namespace cluster here: {exc}") from None
            passed &= measure(cluster, work, image, n, args.repeat)
    return 0 if passed else 1


def measure(cluster, work: Path, image: str, n: int, repeat: int) -> bool:
    hostfile = cluster.write_hostfile(work / "hosts.txt", slots=1)
    plain = Way("without a container", ())
    boxed = Way("podman --container", ("--container", image, "--container-runtime", "podman"))
    say(f"\n{n} node(s), one rank per node: import torch, a gloo all_reduce, exit")
    runs = []
    for rep in range(repeat):
        ways = [plain, boxed] if rep % 2 == 0 else [boxed, plain]
        for way in ways:
            tag = f"{rep}-{'c' if way.flags else 'p'}"
            runs.append(f"bench-container-{tag}")
            stamps = work / f"{tag}.stamps"
            program = work / f"{tag}.py"
            program.write_text(RANK_PROGRAM.format(stamps=str(stamps)))
            argv = [*ORCHESTRATOR, "launch", str(hostfile), "--run-dir", str(work / "runs")]
            argv += ["--run-id", runs[-1], "--color", "never", *way.flags, "--", program.name]
            start = time.time()
            done = subprocess.run(
                argv, env=cluster.environ(), cwd=work, capture_output=True, text=True, timeout=900
            )
            end = time.time()
            found = read_stamps(stamps)
            way.codes.append(done.returncode)
            way.finished.append(end - start)
            if len(found) == n:
                way.started.append(max(found.values()) - start)
            say(
                f"  {way.name}: exit {done.returncode}, {len(found)}/{n} ranks started, "
                f"finished after {end - start:.1f} s"
            )
            if done.returncode != 0:
                said = (done.stdout + done.stderr).strip().splitlines()[-3:]
                say("    last lines: " + " | ".join(said)[:600])
    remove_node_dirs(runs)
    rows = [
        [
            way.name,
            spread(way.started),
            ratio(way.started, plain.started),
            spread(way.finished),
            ratio(way.finished, plain.finished),
            ",".join(map(str, way.codes)),
        ]
        for way in (plain, boxed)
    ]
    say(table(["", "all started s", "ratio", "finished s", "ratio", "exit"], rows))
    passed = all(code == 0 for way in (plain, boxed) for code in way.codes)
    passed = passed and len(plain.started) == len(boxed.started) == repeat
    say(
        f"{n} nodes: {'PASS' if passed else 'FAIL'}: with the container every rank started "
        f"{median(boxed.started) - median(plain.started):+.1f} s later "
        f"({ratio(boxed.started, plain.started)}), finished "
        f"{ratio(boxed.finished, plain.finished)} of the time without"
    )
    return passed


if __name__ == "__main__":
    raise SystemExit(main())
