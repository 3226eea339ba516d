"""Log throughput: ranks printing as fast as they can, into the run's per-rank log files.

    python benchmarks/log_throughput.py [--nodes 4] [--ranks-per-node 1,2] [--lines 100000]
                                        [--repeat 3] [--no-fold]   (as root: it builds a
                                        namespace cluster with sshd, see tests/lab)

The same printing program runs on every node, R ranks per node, in two ways:
  orchestrator   `orchestrator launch` (torchrun, one rank per slot; output of the launch
                 command itself to /dev/null, folded as a console is by default, or not
                 with --no-fold): lines reach runs/<id>/logs/rank-N.log.
  plain ssh      one `ssh NODE 'RANK=N python -u printer.py'` per rank, all at once,
                 output to /dev/null here.
Both run the program with `python -u` (as the orchestrator's node script does), so every
print reaches its pipe or file at once. Each rank marks itself ready and waits until every
rank is, then stamps the time and prints LINES lines `R<rank> #<i> <60 chars that depend
on i>` with print(). Timed:
  window   from the moment the last rank was ready (all start printing together) until the
           last line has arrived: every rank-N.log at its full size (polled every 5 ms) /
           the last ssh client exited. Startup (torchrun, sessions) is outside it.
  e2e      the whole command, minus the median of the same command with 0 lines (the
           empty-job baseline, measured in the same run).
lines/s = all ranks' lines / time. Afterwards every line of every rank-N.log is checked
(count, order, content), and every line of combined.log: zero lost, zero spliced.
"""

from __future__ import annotations

import itertools
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    ORCHESTRATOR,
    PYTHON,
    int_list,
    lab_cluster,
    machine_line,
    median,
    parser,
    ratio,
    remove_node_dirs,
    say,
    scratch,
    spread,
    table,
)

BODY = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" * 2

PRINTER = """\
import os, time
rank, world, lines = int(os.environ["RANK"]), {world}, {lines}
shared = {shared!r}
open(os.path.join(shared, f"ready-{{rank}}"), "w").close()
while sum(name.startswith("ready-") for name in os.listdir(shared)) < world:
    time.sleep(0.001)
with open(os.path.join(shared, f"go-{{rank}}"), "w") as stamp:
    stamp.write(f"{{time.time():.6f}}")
body = {body!r}
for i in range(lines):
    print(f"R{{rank}} #{{i}} {{body[i % 61:i % 61 + 60]}}")
with open(os.path.join(shared, f"done-{{rank}}"), "w") as stamp:
    stamp.write(f"{{time.time():.6f}}")
"""

RUNS = itertools.count()


def expected_line(rank: int, i: int) -> bytes:
    return f"R{rank} #{i} {BODY[i % 61 : i % 61 + 60]}\n".encode()


def expected_size(rank: int, lines: int) -> int:
    return sum(len(expected_line(rank, i)) for i in range(lines))


@dataclass
class Result:
    window: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    empty: list[float] = field(default_factory=list)


class Bench:
    def __init__(self, cluster, work: Path, per_node: int, lines: int, fold: bool = True) -> None:
        self.fold = fold
        self.cluster = cluster
        self.work = work
        self.per_node = per_node
        self.lines = lines
        self.world = per_node * len(cluster.nodes)
        self.hostfile = cluster.write_hostfile(work / f"hosts-{per_node}.txt", slots=per_node)
        self.env = cluster.environ()
        self.run_ids: list[str] = []
        self.sizes = {rank: expected_size(rank, lines) for rank in range(self.world)}

    def prepare(self, lines: int) -> tuple[str, Path]:
        run_id = f"bench-logs-{next(RUNS)}"
        shared = self.work / run_id
        shared.mkdir()
        program = self.work / f"{run_id}.py"
        program.write_text(
            PRINTER.format(world=self.world, lines=lines, shared=str(shared), body=BODY)
        )
        return run_id, program

    def go_time(self, shared: Path) -> float:
        return max(float(p.read_text()) for p in shared.glob("go-*"))

    def orchestrator(self, lines: int) -> tuple[float, float | None]:
        """(e2e s, window s) of one launch."""
        run_id, program = self.prepare(lines)
        self.run_ids.append(run_id)
        logs = self.work / "runs" / run_id / "logs"
        argv = [
            *ORCHESTRATOR,
            "launch",
            str(self.hostfile),
            "--run-dir",
            str(self.work / "runs"),
            "--run-id",
            run_id,
            "--color",
            "never",
            *([] if self.fold else ["--no-fold"]),
            "--",
            program.name,
        ]
        start = time.time()
        proc = subprocess.Popen(
            argv,
            cwd=self.work,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        sizes = self.sizes if lines else {}
        arrived = exited = None
        while exited is None:
            now = time.time()
            if arrived is None and all(
                size_of(logs / f"rank-{r}.log") >= size for r, size in sizes.items()
            ):
                arrived = now
            if proc.poll() is not None:
                exited = now
            time.sleep(0.005)
        proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"launch exited {proc.returncode}: {proc.stderr.read()[-500:]}")
        check_logs(logs, self.world, lines)
        window = arrived - self.go_time(self.work / run_id) if lines else None
        return exited - start, window

    def plain_ssh(self, lines: int) -> tuple[float, float | None]:
        run_id, program = self.prepare(lines)
        procs = []
        start = time.time()
        for rank in range(self.world):
            node = self.cluster.nodes[rank // self.per_node]
            remote = (
                f"cd {shlex.quote(str(self.work))} && RANK={rank} exec "
                f"{shlex.quote(PYTHON)} -u {shlex.quote(program.name)}"
            )
            procs.append(
                subprocess.Popen(
                    self.cluster.ssh_argv(node, remote),
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            )
        while any(p.poll() is None for p in procs):
            time.sleep(0.005)
        end = time.time()
        for p in procs:
            if p.returncode != 0:
                raise RuntimeError(f"ssh exited {p.returncode}: {p.stderr.read()[-500:]}")
        window = end - self.go_time(self.work / run_id) if lines else None
        return end - start, window


def size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def check_logs(logs: Path, world: int, lines: int) -> None:
    """Every line of every rank-N.log and of combined.log, whole, once, in order."""
    for rank in range(world):
        path = logs / f"rank-{rank}.log"
        found = path.read_bytes().splitlines(keepends=True) if path.exists() else []
        if len(found) != lines:
            raise RuntimeError(f"rank-{rank}.log has {len(found)} lines, not {lines}")
        for i, line in enumerate(found):
            if line != expected_line(rank, i):
                raise RuntimeError(f"rank-{rank}.log line {i} is wrong: {line[:100]!r}")
    following = [0] * world
    for line in (logs / "combined.log").read_bytes().splitlines(keepends=True):
        if not line.startswith(b"[") or b"] R" not in line:
            continue  # the orchestrator's own notes and torchrun's lines
        text = line.split(b"] ", 1)[1]
        rank = int(text[1 : text.index(b" ")])
        if text != expected_line(rank, following[rank]):
            raise RuntimeError(f"combined.log: spliced or out of order: {line[:100]!r}")
        following[rank] += 1
    if following != [lines] * world:
        raise RuntimeError(f"combined.log has {following} lines per rank, not {lines}")


def main() -> None:
    cli = parser(__doc__.splitlines()[0], "4", 3)
    cli.add_argument(
        "--ranks-per-node",
        type=int_list,
        default=[1, 2],
        metavar="R,R,...",
        help="ranks per node (default 1,2)",
    )
    cli.add_argument("--lines", type=int, default=100_000, help="lines per rank (default 1e5)")
    cli.add_argument(
        "--no-fold",
        action="store_true",
        help="launch with --no-fold: the console (/dev/null here) shows every line as printed, "
        "without the folding the console does by default",
    )
    args = cli.parse_args()
    say(__doc__.split("\n\n", 2)[2].rstrip())
    say(machine_line())
    say(f"repetitions per contender: {args.repeat}; {args.lines} lines per rank")
    rows, ratios = [], []
    for n in args.nodes:
        with lab_cluster(n) as cluster, scratch("orchestrator-bench-logs-") as work:
            for per_node in args.ranks_per_node:
                bench = Bench(cluster, work, per_node, args.lines, fold=not args.no_fold)
                results = {"orchestrator": Result(), "plain ssh": Result()}
                runners = {"orchestrator": bench.orchestrator, "plain ssh": bench.plain_ssh}
                try:
                    for rep in range(args.repeat):
                        order = list(runners) if rep % 2 == 0 else list(reversed(runners))
                        for name in order:
                            results[name].empty.append(runners[name](0)[0])
                            e2e, window = runners[name](args.lines)
                            results[name].e2e.append(e2e)
                            results[name].window.append(window)
                finally:
                    remove_node_dirs(bench.run_ids)
                total = bench.world * args.lines
                for name, r in results.items():
                    net = [e - median(r.empty) for e in r.e2e]
                    rows.append(
                        [
                            n,
                            per_node,
                            bench.world,
                            name,
                            spread(r.window),
                            f"{total / median(r.window):,.0f}",
                            spread(r.e2e),
                            spread(r.empty),
                            f"{total / median(net):,.0f}",
                        ]
                    )
                orch, ssh = results["orchestrator"], results["plain ssh"]
                ratios.append(
                    [
                        n,
                        per_node,
                        ratio(ssh.window, orch.window),
                        ratio(
                            [e - median(ssh.empty) for e in ssh.e2e],
                            [e - median(orch.empty) for e in orch.e2e],
                        ),
                    ]
                )
    say("")
    say(
        table(
            [
                "nodes",
                "ranks/node",
                "ranks",
                "contender",
                "window s",
                "lines/s (window)",
                "e2e s",
                "empty job s",
                "lines/s (e2e - empty)",
            ],
            rows,
        )
    )
    say("\norchestrator lines/s as a fraction of plain ssh's (target at 4 nodes: >= 0.5x)")
    say(table(["nodes", "ranks/node", "window", "e2e - empty"], ratios))
    say("every line of every rank-N.log and combined.log checked: none lost, none spliced")


if __name__ == "__main__":
    main()
