"""Starting at scale: a sleep job on many nodes, `orchestrator launch` vs pdsh + torchrun.

    python benchmarks/start_at_scale.py [--nodes 128] [--repeat 1] [--sleep 5]
    (as root: it builds a namespace cluster of N nodes with sshd, tests/lab)

One rank per node; each rank stamps its start (time.time(), before any import but os and
time) into a shared file, sleeps --sleep s and exits 0. `orchestrator launch` runs with its
DEFAULT settings (no --heartbeat-timeout, no --grace): at many nodes on few cores every
node imports torch at once, the load average climbs far above the core count, and ranks
come up minutes late. That is the machine, not a fault: the launcher must wait it out and
declare no node lost. The baseline is pdsh (`-f N`, all sessions at once, as torchrun's
static rendezvous needs every node) running the same torchrun command on every node.
The nodes log in with a home whose shell start-up files are empty (sshd `SetEnv HOME=`),
so that root's own ~/.bashrc (pyenv init, 0.2-0.3 s of CPU per session) does not swamp
what is measured; both contenders log in the same way.
"All started" = the latest rank stamp - the command's start; "finished" = its exit - its
start. The contenders alternate (rotating order per repetition). The benchmark passes
(exit 0) when every `orchestrator launch` exited 0, every rank started and no node was
declared lost.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    ORCHESTRATOR,
    machine_line,
    median,
    parser,
    pdsh_environ,
    ratio,
    read_stamps,
    say,
    scratch,
    spread,
    table,
    torchrun_on_each_node,
)

RANK_PROGRAM = """\
import os, time
with open({stamps!r}, "a") as stamps:
    stamps.write(f"{{os.environ['GROUP_RANK']}} {{time.time():.6f}}\\n")
time.sleep({sleep})
"""

PORTS = itertools.count(23000)


@dataclass
class Contender:
    name: str
    started: list[float] = field(default_factory=list)
    finished: list[float] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    lost: list[list[str]] = field(default_factory=list)  # lines saying a node was lost


class Bench:
    def __init__(self, cluster, work: Path, sleep: float, timeout: float) -> None:
        self.cluster = cluster
        self.work = work
        self.sleep = sleep
        self.timeout = timeout
        self.names = [node.name for node in cluster.nodes]
        self.addresses = [node.address for node in cluster.nodes]
        self.hostfile = cluster.write_hostfile(work / "hosts.txt", slots=1)
        self.env = cluster.environ()
        self.pdsh_env = pdsh_environ(cluster)

    def program(self, stamps: Path) -> str:
        path = stamps.with_suffix(".py")
        path.write_text(RANK_PROGRAM.format(stamps=str(stamps), sleep=self.sleep))
        return path.name

    def launch(self, stamps: Path) -> tuple[list[str], dict[str, str]]:
        argv = [*ORCHESTRATOR, "launch", str(self.hostfile), "--run-dir", str(self.work / "runs")]
        argv += ["--run-id", f"bench-scale-{stamps.stem}", "--color", "never"]
        return [*argv, "--", self.program(stamps)], self.env

    def pdsh_torchrun(self, stamps: Path) -> tuple[list[str], dict[str, str]]:
        remote = torchrun_on_each_node(self.addresses, self.work, self.program(stamps), next(PORTS))
        fanout = str(len(self.names))
        argv = ["pdsh", "-R", "ssh", "-S", "-f", fanout, "-w", ",".join(self.names), remote]
        return argv, self.pdsh_env

    def run_once(self, contender: Contender, command, tag: str) -> None:
        stamps = self.work / f"{tag}.stamps"
        argv, env = command(stamps)
        log = self.work / f"{tag}.out"
        start = time.time()
        with log.open("w") as out:
            try:
                done = subprocess.run(
                    argv,
                    env=env,
                    cwd=self.work,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=self.timeout,
                )
                code = done.returncode
            except subprocess.TimeoutExpired:
                code = 124
        end = time.time()
        found = read_stamps(stamps)
        text = log.read_text(errors="replace")
        contender.codes.append(code)
        contender.finished.append(end - start)
        if len(found) == len(self.names):
            contender.started.append(max(found.values()) - start)
        contender.lost.append([line for line in text.splitlines() if " lost" in line])
        say(
            f"  {contender.name}: exit {code}, {len(found)}/{len(self.names)} ranks started, "
            f"finished after {end - start:.1f} s"
            + (f", {len(contender.lost[-1])} line(s) saying lost" if contender.lost[-1] else "")
        )
        if contender is self.ours or code != 0:
            lost_nodes = sorted(set(re.findall(r"(\S+): lost:", text)))
            if lost_nodes:
                say(f"    {len(lost_nodes)} node(s) declared lost: {' '.join(lost_nodes)}")
            say("    last lines: " + " | ".join(text.strip().splitlines()[-3:])[:600])


def main() -> int:
    cli = parser(__doc__.splitlines()[0], "128", 1)
    cli.add_argument("--sleep", type=float, default=5, help="seconds each rank sleeps (5)")
    cli.add_argument(
        "--timeout", type=float, default=1800, help="seconds one launch may take (1800)"
    )
    args = cli.parse_args()
    say(__doc__.split("\n\n", 2)[2].rstrip())
    say(machine_line())
    verdicts = []
    for n in args.nodes:
        verdicts.append(measure(n, args.repeat, args.sleep, args.timeout))
    return 0 if all(verdicts) else 1


def measure(n: int, repeat: int, sleep: float, timeout: float) -> bool:
    from tests.lab import LabUnavailable, make_cluster
    from tests.lab.bad_days import plain_home

    ours, baseline = Contender("orchestrator launch"), Contender("pdsh + torchrun")
    with scratch("orchestrator-bench-scale-") as work:
        home = plain_home(work / "home")
        say(f"\n{n} node(s), one rank per node, ranks sleep {sleep:g} s; login HOME={home}")
        with contextlib.ExitStack() as stack:
            try:
                cluster = stack.enter_context(make_cluster(n, sshd_extra=f"SetEnv HOME={home}"))
                say(cluster.confine())  # as on a real cluster: see common.lab_cluster
            except LabUnavailable as exc:
                raise SystemExit(f"cannot build the namespace cluster here: {exc}") from None
            say(machine_line().replace("at start", "with the cluster up"))
            bench = Bench(cluster, work, sleep, timeout)
            bench.ours = ours
            pairs = [(ours, bench.launch), (baseline, bench.pdsh_torchrun)]
            for rep in range(repeat):
                shift = rep % 2
                for contender, command in pairs[shift:] + pairs[:shift]:
                    bench.run_once(contender, command, f"{n}-{rep}-{contender.name[:4]}")
    rows = [
        [
            c.name,
            spread(c.started),
            ratio(c.started, baseline.started),
            spread(c.finished),
            ratio(c.finished, baseline.finished),
            ",".join(map(str, c.codes)),
            sum(1 for lines in c.lost if lines),
        ]
        for c in (ours, baseline)
    ]
    headers = ["contender", "all started s", "vs pdsh", "finished s", "vs pdsh", "exit", "lost"]
    say(table(headers, rows))
    lost_lines = [line for lines in ours.lost for line in lines]
    for line in lost_lines[:5]:
        say(f"  lost: {line.strip()[:200]}")
    whole = len(ours.started) == len(ours.codes)  # every rank started, every time
    passed = all(code == 0 for code in ours.codes) and not lost_lines and whole
    say(
        f"{n} nodes: {'PASS' if passed else 'FAIL'}: orchestrator launch exit "
        f"{','.join(map(str, ours.codes))}, node(s) declared lost: "
        f"{'yes' if lost_lines else 'no'}, every rank started: {'yes' if whole else 'no'}; "
        f"finished {median(ours.finished):.1f} s vs "
        f"{median(baseline.finished):.1f} s ({ratio(ours.finished, baseline.finished)})"
    )
    return passed


if __name__ == "__main__":
    raise SystemExit(main())
