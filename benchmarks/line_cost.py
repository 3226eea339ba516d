"""The controller's CPU per streamed line, against pdsh and its ssh processes on the same job.

    python benchmarks/line_cost.py [--nodes 16] [--rate 100] [--seconds 30] [--repeat 3]
                                   [--no-fold]   (as root: it builds a namespace cluster of
                                   N nodes with sshd, see tests/lab)

One rank per node prints RATE short distinct lines a second for SECONDS (`r<rank> step <i>
loss <x>`), paced by the clock, then exits. Contenders, interleaved (one repetition of each,
then the next):
  orchestrator   `orchestrator launch` (torchrun on every node; the launch's own output to
                 /dev/null, folded as a console is by default, or not with --no-fold): the
                 lines reach runs/<id>/logs/rank-N.log and combined.log.
  pdsh           `pdsh -R ssh -w NODES 'RANK=r python -u printer.py'` (its default fan-out
                 of 32), its output into a file: the lines reach that file, `node: line`.
CPU is this benchmark's waited-for children (user + system; pdsh's ssh processes are
pdsh's children and count for it); the nodes' processes are not counted (they are children
of the nodes' sshd). Each contender also runs the same job with a rank that prints nothing
and sleeps as long: CPU per line = (CPU printing - CPU sleeping) / lines, so start-up and
heartbeats cancel out. Every line is counted at the end: none may be lost.
Target (issue: a controller cheaper than pdsh per line): orchestrator / pdsh <= 1.0x.
"""

from __future__ import annotations

import itertools
import shlex
import subprocess
from pathlib import Path

from common import (
    ORCHESTRATOR,
    PYTHON,
    children_cpu,
    lab_cluster,
    machine_line,
    median,
    node_rank_from_address,
    parser,
    pdsh_environ,
    remove_node_dirs,
    say,
    scratch,
    table,
)

PRINTER = """\
import os, sys, time
rank, rate, seconds = int(os.environ["RANK"]), {rate}, {seconds}
lines = int(rate * seconds)
start = time.monotonic()
for i in range(lines):
    print(f"r{{rank}} step {{i}} loss {{1.0 / (i + 1):.6f}}")
    pause = start + (i + 1) / rate - time.monotonic()
    if pause > 0:
        time.sleep(pause)
if not lines:
    time.sleep(seconds)
"""

RUNS = itertools.count()


class Bench:
    def __init__(self, cluster, work: Path, rate: float, seconds: float, fold: bool) -> None:
        self.cluster = cluster
        self.work = work
        self.rate = rate
        self.seconds = seconds
        self.fold = fold
        self.names = [node.name for node in cluster.nodes]
        self.addresses = [node.address for node in cluster.nodes]
        self.hostfile = cluster.write_hostfile(work / "hosts.txt", slots=1)
        self.env = cluster.environ()
        self.pdsh_env = pdsh_environ(cluster)
        self.run_ids: list[str] = []

    def program(self, printing: bool) -> Path:
        name = f"printer-{next(RUNS)}.py"
        rate = self.rate if printing else 0
        (self.work / name).write_text(PRINTER.format(rate=rate, seconds=self.seconds))
        return self.work / name

    def lines(self, printing: bool) -> int:
        return int(self.rate * self.seconds) * len(self.names) if printing else 0

    def timed(self, argv: list[str], env: dict[str, str], stdout) -> float:
        """CPU seconds of one command run to its end, its waited-for children included."""
        before = children_cpu()
        done = subprocess.run(
            argv,
            cwd=self.work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=self.seconds + 600,
        )
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise SystemExit(f"{argv[0]} exited {done.returncode}: {tail}")
        return children_cpu() - before

    def orchestrator(self, printing: bool) -> float:
        program = self.program(printing)
        run_id = f"bench-lines-{program.stem}"
        self.run_ids.append(run_id)
        argv = [*ORCHESTRATOR, "launch", str(self.hostfile), "--run-dir", str(self.work / "runs")]
        argv += ["--run-id", run_id, "--color", "never", *([] if self.fold else ["--no-fold"])]
        cpu = self.timed([*argv, "--", program.name], self.env, subprocess.DEVNULL)
        logs = self.work / "runs" / run_id / "logs"
        want = self.lines(printing)
        got = sum(len(p.read_bytes().splitlines()) for p in logs.glob("rank-*.log"))
        combined = len((logs / "combined.log").read_bytes().splitlines())
        if got != want or combined < want:
            raise SystemExit(
                f"orchestrator: {got} lines in rank files, {combined} in combined.log, of {want}"
            )
        return cpu

    def pdsh(self, printing: bool) -> float:
        program = self.program(printing)
        remote = (
            f"{node_rank_from_address(self.addresses)}; cd {shlex.quote(str(self.work))}"
            f" && RANK=$r exec {shlex.quote(PYTHON)} -u {shlex.quote(program.name)}"
        )
        out = self.work / f"{program.stem}.out"
        with out.open("wb") as sink:
            argv = ["pdsh", "-R", "ssh", "-w", ",".join(self.names), remote]
            cpu = self.timed(argv, self.pdsh_env, sink)
        got = sum(b" step " in line for line in out.read_bytes().splitlines())
        if got != self.lines(printing):
            raise SystemExit(f"pdsh: {got} lines of {self.lines(printing)}")
        return cpu


def main() -> int:
    cli = parser(__doc__.splitlines()[0], "16", 3)
    cli.add_argument("--rate", type=float, default=100, help="lines a second per rank (100)")
    cli.add_argument("--seconds", type=float, default=30, help="how long each rank prints (30)")
    cli.add_argument("--no-fold", action="store_true", help="launch with --no-fold")
    args = cli.parse_args()
    say(machine_line())
    rows = []
    for n in args.nodes:
        with (
            scratch("orchestrator-bench-lines-") as work,
            lab_cluster(n, plain_home=work / "home") as cluster,
        ):
            bench = Bench(cluster, work, args.rate, args.seconds, not args.no_fold)
            lines = bench.lines(True)
            per_line: dict[str, list[float]] = {"orchestrator": [], "pdsh": []}
            try:
                for rep in range(args.repeat):
                    order = [("orchestrator", bench.orchestrator), ("pdsh", bench.pdsh)]
                    for name, run in order[rep % 2 :] + order[: rep % 2]:
                        quiet = run(False)
                        busy = run(True)
                        per_line[name].append((busy - quiet) / lines * 1e6)
                        say(
                            f"{n} nodes, {name}: {busy:.2f} s CPU printing, {quiet:.2f} s "
                            f"sleeping: {per_line[name][-1]:.1f} us per line"
                        )
            finally:
                remove_node_dirs(bench.run_ids)
            ours, theirs = median(per_line["orchestrator"]), median(per_line["pdsh"])
            rows.append(
                [
                    n,
                    f"{lines:,}",
                    f"{ours:.1f} ({min(per_line['orchestrator']):.1f}-"
                    f"{max(per_line['orchestrator']):.1f})",
                    f"{theirs:.1f} ({min(per_line['pdsh']):.1f}-{max(per_line['pdsh']):.1f})",
                    f"{ours / theirs:.2f}x" if theirs > 0 else "-",
                ]
            )
    fold = "--no-fold" if args.no_fold else "folded console"
    say(
        f"\n{args.rate:g} lines/s per rank for {args.seconds:g} s, {fold}; medians of {args.repeat}"
    )
    say(
        table(
            ["nodes", "lines", "orchestrator us/line", "pdsh + ssh us/line", "ratio"],
            rows,
        )
    )
    say("target: orchestrator / pdsh <= 1.0x; no line lost (checked)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
