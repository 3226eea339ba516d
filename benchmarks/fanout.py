"""Fan-out over SSH: from the command's start until every node's remote process has started.

    python benchmarks/fanout.py [--nodes 1,8,16] [--repeat 3] [--part a|b|both]
                                [--skip-no-preflight]
    (as root: it builds a namespace cluster of N nodes with sshd per node count, tests/lab)

(a) a trivial command on every node: `orchestrator exec`, a sequential `ssh` loop, `pdsh`.
    The command is the same for all three, run by bash on the node; its first (and only)
    action appends the node's address and $EPOCHREALTIME (a bash builtin, no process) to a
    file every node shares. "Started" = the latest of those stamps - the command's start.
(b) a torchrun job with one rank per node: `orchestrator launch` (default: with its
    preflight probe; and with --no-preflight) and `pdsh` running the same torchrun command
    (static rendezvous at node 0, node rank from the node's address). The rank's program
    appends its node rank and time.time() as its first statement, before any import but os
    and time. "Started" = the latest stamp - the command's start: so it includes starting
    torchrun (which imports torch) and torchrun's rendezvous of all nodes, for everyone.
    Without the probe nothing picks a free port, so --no-preflight runs get --master-port.
    pdsh runs all sessions at once here (`-f N`): the rendezvous needs every node; and it
    waits up to PDSH_CONNECT_TIMEOUT_S for each connection (`-t`).
"Finished" = the command's exit - its start. "CPU here" = the CPU time (user + system) the
command and its descendants used on this machine, per node: the controller for
`orchestrator`, pdsh or the loop and their ssh processes for the others. Every contender
runs once per repetition, in a rotating order, after one `import torch` here has put
torch's files in the page cache; medians (min-max) over the repetitions,
ratios of medians. Each SSH session runs the node user's login shell; the nodes log in with
a home whose start-up files are empty (root's own ~/.bashrc may run pyenv on every session,
and at 256 nodes hundreds of them queue on pyenv's lock: that would measure pyenv). For the
trivial command pdsh keeps its default fan-out of 32 sessions at a time.
"""

from __future__ import annotations

import itertools
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    ORCHESTRATOR,
    PYTHON,
    children_cpu,
    lab_cluster,
    machine_line,
    median,
    parser,
    pdsh_environ,
    ratio,
    read_stamps,
    run_command,
    say,
    scratch,
    spread,
    table,
    torchrun_on_each_node,
)

STAMP_COMMAND = 'set -- $SSH_CONNECTION; echo "$3 $EPOCHREALTIME" >> {stamps}'

RANK_PROGRAM = """\
import os, time
with open({stamps!r}, "a") as stamps:
    stamps.write(f"{{os.environ['GROUP_RANK']}} {{time.time():.6f}}\\n")
"""

PORTS = itertools.count(21000)
# pdsh's connect timeout for the torchrun job (its default is 10 s, passed to ssh as
# ConnectTimeout): with 256 handshakes at once on two cores, 40 of 256 sessions took longer
# and were dropped, and the rest then waited at the rendezvous for ever. `orchestrator`
# opens at most 64 connections at a time and retries a failed handshake.
PDSH_CONNECT_TIMEOUT_S = 120


@dataclass
class Contender:
    name: str
    command: Callable[[Path], tuple[list[str], dict[str, str]]]  # stamps file -> argv, env
    started: list[float] = field(default_factory=list)
    finished: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # s of CPU on this machine, per node
    nodes_cpu: list[float] = field(default_factory=list)  # s of the nodes' CPU, per node
    failures: list[str] = field(default_factory=list)


class Bench:
    """The contenders of one node count, on one cluster."""

    def __init__(self, cluster, work: Path) -> None:
        self.cluster = cluster
        self.work = work
        self.names = [node.name for node in cluster.nodes]
        self.addresses = [node.address for node in cluster.nodes]
        self.hostfile = cluster.write_hostfile(work / "hosts.txt", slots=1)
        self.env = cluster.environ()
        self.config = str(cluster.ssh.config_path)
        self.pdsh_env = pdsh_environ(cluster)
        self.runs = work / "runs"

    # --- (a) a trivial command --------------------------------------------------------

    def exec_contenders(self) -> list[Contender]:
        def stamp(stamps: Path) -> str:
            return STAMP_COMMAND.format(stamps=shlex.quote(str(stamps)))

        def orchestrator_exec(stamps: Path):
            return [
                *ORCHESTRATOR,
                "exec",
                str(self.hostfile),
                "--color",
                "never",
                "--",
                stamp(stamps),
            ], self.env

        def ssh_loop(stamps: Path):
            loop = (
                f"for host in {shlex.join(self.names)}; do "
                f'ssh -F {shlex.quote(self.config)} "$host" {shlex.quote(stamp(stamps))}'
                " || exit 1; done"
            )
            return ["bash", "-c", loop], self.env

        def pdsh(stamps: Path):
            return [
                "pdsh",
                "-R",
                "ssh",
                "-S",
                "-w",
                ",".join(self.names),
                stamp(stamps),
            ], self.pdsh_env

        return [
            Contender("orchestrator exec", orchestrator_exec),
            Contender("ssh loop", ssh_loop),
            Contender("pdsh", pdsh),
        ]

    # --- (b) a torchrun job -----------------------------------------------------------

    def program(self, stamps: Path) -> str:
        path = stamps.with_suffix(".py")
        path.write_text(RANK_PROGRAM.format(stamps=str(stamps)))
        return path.name

    def launch_contenders(self) -> list[Contender]:
        def launch(*extra: str):
            def command(stamps: Path):
                run_id = f"bench-fanout-{stamps.stem}"
                return [
                    *ORCHESTRATOR,
                    "launch",
                    str(self.hostfile),
                    "--run-dir",
                    str(self.runs),
                    "--run-id",
                    run_id,
                    "--color",
                    "never",
                    *extra,
                    "--",
                    self.program(stamps),
                ], self.env

            return command

        def no_preflight(stamps: Path):
            return launch("--no-preflight", "--master-port", str(next(PORTS)))(stamps)

        def pdsh_torchrun(stamps: Path):
            remote = torchrun_on_each_node(
                self.addresses, self.work, self.program(stamps), next(PORTS)
            )
            # all sessions at once: torchrun's static rendezvous waits for every node
            fanout = str(len(self.names))
            argv = ["pdsh", "-R", "ssh", "-S", "-f", fanout, "-t", str(PDSH_CONNECT_TIMEOUT_S)]
            argv += ["-w", ",".join(self.names), remote]
            return argv, self.pdsh_env

        return [
            Contender("orchestrator launch", launch()),
            Contender("launch --no-preflight", no_preflight),
            Contender("pdsh + torchrun", pdsh_torchrun),
        ]

    # --- running ----------------------------------------------------------------------

    def nodes_cpu(self) -> float | None:
        """CPU seconds the nodes' processes used so far (their cgroup's account), if kept."""
        group = self.cluster.apart
        return group.cpu_seconds() if group is not None else None

    def measure(self, contenders: list[Contender], keys: set[str], repeat: int, tag: str) -> None:
        for rep in range(repeat):
            shift = rep % len(contenders)
            for index, contender in enumerate(contenders[shift:] + contenders[:shift]):
                stamps = self.work / f"{tag}-{rep}-{index}.stamps"
                argv, env = contender.command(stamps)
                before, nodes_before = children_cpu(), self.nodes_cpu()
                limit = max(300, 8 * len(keys))  # a start at 256 nodes takes ~15 minutes here
                try:
                    start, end, done = run_command(argv, env, cwd=self.work, timeout=limit)
                except subprocess.TimeoutExpired:
                    contender.failures.append(f"did not end within {limit} s (killed)")
                    continue
                cpu, nodes_after = children_cpu() - before, self.nodes_cpu()
                found = read_stamps(stamps)
                if done.returncode != 0 or set(found) != keys:
                    tail = " | ".join(done.stderr.strip().splitlines()[-3:])
                    contender.failures.append(
                        f"exit {done.returncode}, {len(found)} of {len(keys)} started: {tail}"
                    )
                    continue
                contender.started.append(max(found.values()) - start)
                contender.finished.append(end - start)
                contender.cpu.append(cpu / len(keys))
                if nodes_before is not None and nodes_after is not None:
                    contender.nodes_cpu.append((nodes_after - nodes_before) / len(keys))


def ms(values: list[float]) -> str:
    return f"{1000 * median(values):.1f}" if values else "-"


def report(n: int, title: str, contenders: list[Contender], baseline: Contender) -> None:
    rows = []
    for c in contenders:
        rows.append(
            [
                c.name,
                spread(c.started),
                ratio(c.started, baseline.started),
                spread(c.finished),
                ratio(c.finished, baseline.finished),
                ms(c.cpu),
                ms(c.nodes_cpu),
                f"{len(c.started)}" + (f" ({len(c.failures)} failed)" if c.failures else ""),
            ]
        )
    say(f"\n{n} node(s), {title}")
    say(
        table(
            [
                "contender",
                "all started s",
                f"vs {baseline.name}",
                "finished s",
                f"vs {baseline.name}",
                "CPU here, ms/node",
                "nodes' CPU, ms/node",
                "runs",
            ],
            rows,
        )
    )
    for c in contenders:
        for failure in c.failures:
            say(f"  {c.name} failed: {failure}")


def main() -> None:
    cli = parser(__doc__.splitlines()[0], "1,8,16", 3)
    cli.add_argument(
        "--part",
        choices=["a", "b", "both"],
        default="both",
        help="(a) the trivial command, (b) the torchrun job, or both (default)",
    )
    cli.add_argument(
        "--skip-no-preflight",
        action="store_true",
        help="(b) leave out `launch --no-preflight`: two contenders, so that repetitions at "
        "256 nodes fit in less time",
    )
    args = cli.parse_args()
    say(__doc__.split("\n\n", 2)[2].rstrip())
    say(machine_line())
    say(f"repetitions per contender: {args.repeat}")
    summary = []
    for n in args.nodes:
        with (
            scratch("orchestrator-bench-fanout-") as work,
            lab_cluster(n, plain_home=work / "home", apart=True) as cluster,
        ):
            bench = Bench(cluster, work)
            exec_side, launch_side = bench.exec_contenders(), bench.launch_contenders()
            # the nodes' copies of each run land in their plain home, inside `work`
            if args.part in ("a", "both"):
                bench.measure(exec_side, set(bench.addresses), args.repeat, f"exec{n}")
                report(n, "(a) trivial command", exec_side, exec_side[2])
            if args.part in ("b", "both"):
                # torch's files in the page cache before the first contender, not during it
                subprocess.run([PYTHON, "-c", "import torch"], check=True)
                measured = (
                    [launch_side[0], launch_side[2]] if args.skip_no_preflight else launch_side
                )
                bench.measure(measured, {str(i) for i in range(n)}, args.repeat, f"job{n}")
                report(n, "(b) torchrun job, one rank per node", measured, launch_side[2])
            summary.append((n, exec_side, launch_side))
    say(
        "\nall started, ratio of medians (target: exec <= 1.0x pdsh, launch <= 1.0x pdsh + "
        "torchrun); CPU on this machine per node, median ms (flat: not growing with nodes)"
    )
    rows = [
        [
            n,
            ratio(e[0].started, e[2].started),
            ratio(e[1].started, e[2].started),
            ratio(j[0].started, j[2].started),
            ratio(j[1].started, j[2].started),
            ms(e[0].cpu),
            ms(e[2].cpu),
            ms(j[0].cpu),
            ms(j[2].cpu),
        ]
        for n, e, j in summary
    ]
    say(
        table(
            [
                "nodes",
                "exec/pdsh",
                "ssh loop/pdsh",
                "launch/pdsh+torchrun",
                "launch --no-preflight/pdsh+torchrun",
                "exec CPU",
                "pdsh CPU",
                "launch CPU",
                "pdsh+torchrun CPU",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
