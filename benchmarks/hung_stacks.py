"""`orchestrator stacks` on a hung job, against py-spy dump looped over pdsh by hand.

    python benchmarks/hung_stacks.py [--nodes 64] [--ranks-per-node 2] [--repeat 3]
    (as root: it builds a namespace cluster of N nodes with sshd, tests/lab)

The job: every rank joins a gloo group and prints "ready"; one rank (on a middle node) then
waits forever in a function of its own, and every other rank waits in an all_reduce for it.
Once every rank is ready, the run is asked for its stacks `--repeat` times; the baseline,
the same times in the same run, is what a guide to debugging hangs does by hand: `pdsh -f N`
runs `py-spy dump` for every rank process of every node, and its output is what a person
then reads. Counted: seconds until the answer is printed (median), the lines printed, and
each rank's pause (the py-spy call's wall time, an upper bound on the stop). Passes when
the median answer comes within 5 s, the answer is at most 15 lines, and its first group is
the stuck rank alone.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

from common import (
    ORCHESTRATOR,
    PYTHON,
    lab_cluster,
    machine_line,
    median,
    parser,
    pdsh_environ,
    say,
    scratch,
    table,
    wait_until,
)

JOB = Path(__file__).resolve().parent.parent / "tests" / "data" / "hang_job.py"
MOST_SECONDS, MOST_LINES = 5.0, 15


def py_spy_by_hand(cluster, work: Path) -> list[str]:
    """pdsh -f N: py-spy dump of every process of the job on every node (as by hand)."""
    py_spy = str(Path(PYTHON).parent / "py-spy")
    dump = f"{shlex.quote(py_spy)} dump --pid $p"
    # every Python process of the job on the node, as by hand: the ranks, and torchrun (its
    # command line names the script too); not the shells that wrap them. The lab's nodes
    # share one pid namespace, so "on the node" is "in the node's network namespace".
    here = '[ "$(readlink /proc/$p/ns/net)" = "$(readlink /proc/self/ns/net)" ]'
    loop = (
        f"for p in $(pgrep -f hang_job.py); do {here} || continue; "
        f"case $(readlink /proc/$p/exe) in *python*) {dump};; esac; done"
    )
    hosts = ",".join(node.address for node in cluster.nodes)
    argv = ["pdsh", "-R", "ssh", "-S", "-f", str(len(cluster.nodes)), "-w", hosts, loop]
    done = subprocess.run(
        argv, cwd=work, env=pdsh_environ(cluster), capture_output=True, text=True, timeout=600
    )
    return (done.stdout + done.stderr).splitlines()


def measure(n: int, per_node: int, repeat: int) -> bool:
    world = n * per_node
    stuck = (n // 2) * per_node + 1
    with (
        scratch("orchestrator-bench-stacks-") as work,
        lab_cluster(n, plain_home=work / "home", apart=True) as cluster,
    ):
        say(f"\n{n} node(s), {per_node} rank(s) each ({world} ranks); {machine_line()}")
        hostfile = cluster.write_hostfile(work / "hosts.txt", slots=per_node)
        env = cluster.environ()
        runs = work / "runs"
        launch = [*ORCHESTRATOR, "launch", str(hostfile), "--run-dir", str(runs)]
        launch += ["--run-id", "hung", "--detach", "--hang-timeout", "0"]
        launch += ["--env", f"STUCK_RANK={stuck}", "--", str(JOB)]
        started = subprocess.run(launch, cwd=work, env=env, capture_output=True, text=True)
        if started.returncode != 0:
            raise SystemExit(f"the launch failed:\n{started.stdout}{started.stderr}")
        combined = runs / "hung" / "logs" / "combined.log"
        try:
            wait_until(
                lambda: combined.exists() and combined.read_text().count("ready") >= world,
                1800,
                "every rank ready",
            )
            time.sleep(5)  # the others reach the all_reduce
            ours, theirs, pauses, shown = [], [], [], []
            for _ in range(repeat):
                began = time.monotonic()
                asked = subprocess.run(
                    [*ORCHESTRATOR, "stacks", "hung", "--run-dir", str(runs)],
                    env=env, capture_output=True, text=True, timeout=600,
                )  # fmt: skip
                ours.append(time.monotonic() - began)
                shown = asked.stdout.splitlines()
                folder = Path(shown[-1].rsplit(" in ", 1)[1])
                kept = json.loads((folder / "stacks.json").read_text())
                pauses += [r["pause_s"] for r in kept["ranks"] if r.get("pause_s") is not None]
                began = time.monotonic()
                by_hand = py_spy_by_hand(cluster, work)
                theirs.append(time.monotonic() - began)
        finally:
            subprocess.run(
                [*ORCHESTRATOR, "stop", "hung", "--run-dir", str(runs), "--wait", "120"],
                env=env, capture_output=True, timeout=300,
            )  # fmt: skip
    say("  `orchestrator stacks`, as shown:\n    " + "\n    ".join(shown))
    say(
        f"  pdsh + py-spy dump, its first lines of {len(by_hand)}:\n    "
        + "\n    ".join(by_hand[:12])
    )
    pauses.sort()
    rows = [
        ["orchestrator stacks", f"{median(ours):.1f}", len(shown)],
        ["pdsh + py-spy dump", f"{median(theirs):.1f}", len(by_hand)],
    ]
    say(table(["contender", "seconds (median)", "lines"], rows))
    say(
        f"  each rank's pause (py-spy call, upper bound): median {median(pauses) * 1000:.0f} "
        f"ms, max {pauses[-1] * 1000:.0f} ms over {len(pauses)} dumps"
    )
    odd_first = shown[0].split("]")[0].endswith(f" r{stuck}") and " 1 rank:" in shown[0]
    passed = median(ours) <= MOST_SECONDS and len(shown) <= MOST_LINES and odd_first
    say(
        f"{n} nodes: {'PASS' if passed else 'FAIL'}: answered in {median(ours):.1f} s "
        f"({median(ours) / median(theirs):.2f}x pdsh + py-spy), {len(shown)} line(s) "
        f"({len(shown) / max(1, len(by_hand)):.3f}x), the stuck rank first: {odd_first}"
    )
    return passed


def main() -> int:
    cli = parser(__doc__.splitlines()[0], "64", 3)
    cli.add_argument("--ranks-per-node", type=int, default=2, help="ranks per node (2)")
    args = cli.parse_args()
    say(__doc__.split("\n\n", 2)[2].rstrip())
    results = [measure(n, args.ranks_per_node, args.repeat) for n in args.nodes]
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
