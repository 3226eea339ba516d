"""Through a login node with stock sshd settings: every node reached, and at what cost.

    python benchmarks/jump_host.py [--nodes 250] [--repeat 3] [--launch-rounds 1]
    (as root: it builds a namespace cluster of N + 1 nodes with sshd, tests/lab)

Node 0 is the jump host: its sshd keeps OpenSSH's defaults (no MaxStartups line, so
10:30:100: beyond 10 unauthenticated connections it drops new ones at random). The other
N nodes are reached through it (`ProxyJump` in the client config), or, for the baseline
in the same run, directly. Each repetition runs, in a rotating order:

- `orchestrator exec HOSTS -- true`, through the jump host and direct;
- OpenSSH's `ssh -J`-style ProxyJump, one process per node, all at once;
- `pdsh -R ssh` (its default fan-out of 32) with the same ProxyJump config;
- OpenSSH multiplexed: one `ControlMaster` connection to the jump host, then one
  `ssh -o ProxyCommand='ssh -S SOCKET -W %h:%p jump'` per node, all at once.

and `--launch-rounds` times a hello `orchestrator launch` (one rank per node) through the
jump host and direct. For each: the nodes reached (of N) and the wall time, medians and
ratios against the same on direct connections. The nodes' login shells start with empty
start-up files (LAB.md, "Timing at many nodes"). A launch at 250 nodes starts 250 torchruns
at once, ~40 GB here: give the machine swap first (benchmarks/idle_controller.py says how).
"""

from __future__ import annotations

import itertools
import shlex
import subprocess
import sys
import time
from pathlib import Path

from common import (
    ORCHESTRATOR,
    lab_cluster,
    machine_line,
    parser,
    pdsh_environ,
    ratio,
    say,
    scratch,
    spread,
    table,
)

HELLO = "import os\nprint(f\"hello from rank {os.environ['RANK']}\", flush=True)\n"


class Bench:
    def __init__(self, cluster, work: Path) -> None:
        self.cluster = cluster
        self.work = work
        self.jump = cluster.nodes[0]
        self.behind = cluster.nodes[1:]
        self.hostfile = cluster.write_hostfile(work / "hosts.txt", self.behind)
        self.env = cluster.environ()
        base = cluster.ssh.default_config(cluster.nodes, cluster.subnet_glob)
        names = " ".join(node.name for node in self.behind)
        self.direct_config = work / "direct.config"
        self.direct_config.write_text(base)
        self.jump_config = work / "jump.config"
        self.jump_config.write_text(f"Host {names}\n    ProxyJump {self.jump.name}\n" + base)
        self.mux_socket = work / "mux.sock"
        (work / "hello.py").write_text(HELLO)
        self.times: dict[str, list[float]] = {}
        self.reached: dict[str, list[int]] = {}
        self.codes: dict[str, list[int]] = {}  # each run's exit code (0 for ssh and pdsh)
        self.launches = itertools.count()

    def record(self, name: str, started: float, reached: int, code: int = 0) -> None:
        """One run: the nodes it reached and, for our own commands, their exit code (a
        launch whose every rank printed can still fail after, and must not pass)."""
        self.times.setdefault(name, []).append(time.monotonic() - started)
        self.reached.setdefault(name, []).append(reached)
        self.codes.setdefault(name, []).append(code)
        exited = f", exit code {code}" if code else ""
        say(f"  {name}: {reached}/{len(self.behind)} in {self.times[name][-1]:.1f} s{exited}")

    def exec(self, name: str, config: Path) -> None:
        argv = [*ORCHESTRATOR, "exec", str(self.hostfile), "--ssh-config", str(config)]
        started = time.monotonic()
        done = subprocess.run(
            [*argv, "--color", "never", "--no-fold", "--", "echo", "ok"],
            env=self.env,
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        lines = set(done.stdout.splitlines())
        reached = sum(f"[{n.name}] ok" in lines for n in self.behind)
        self.record(name, started, reached, done.returncode)

    def ssh_each(self, name: str, options: list[str]) -> None:
        started = time.monotonic()
        procs = [
            subprocess.Popen(
                ["ssh", "-F", str(self.jump_config), *options, node.name, "echo", "ok"],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for node in self.behind
        ]
        outputs = [proc.communicate(timeout=600)[0] for proc in procs]
        self.record(name, started, sum(out.strip() == "ok" for out in outputs))

    def pdsh(self) -> None:
        started = time.monotonic()
        done = subprocess.run(
            ["pdsh", "-R", "ssh", "-w", ",".join(n.name for n in self.behind), "echo", "ok"],
            env=pdsh_environ(self.cluster, self.jump_config),
            capture_output=True,
            text=True,
            timeout=1800,
        )
        lines = set(done.stdout.splitlines())
        self.record("pdsh via jump", started, sum(f"{n.name}: ok" in lines for n in self.behind))

    def multiplexed(self) -> None:
        master = ["ssh", "-F", str(self.jump_config), "-S", str(self.mux_socket)]
        subprocess.run(
            [*master, "-M", "-f", "-N", self.jump.name], env=self.env, check=True, timeout=60
        )
        try:
            proxy = f"ssh -F {self.jump_config} -S {self.mux_socket} -W %h:%p {self.jump.name}"
            self.ssh_each("ssh, one ControlMaster", ["-o", f"ProxyCommand={proxy}"])
        finally:
            subprocess.run(
                [*master, "-O", "exit", self.jump.name], env=self.env, capture_output=True
            )

    def launch(self, name: str, config: Path) -> None:
        run_id = f"jumpbench{next(self.launches)}"
        started = time.monotonic()
        done = subprocess.run(
            [
                *ORCHESTRATOR,
                "launch",
                str(self.hostfile),
                "--ssh-config",
                str(config),
                "--run-dir",
                str(self.work / "runs"),
                "--run-id",
                run_id,
                "--color",
                "never",
                "--",
                "hello.py",
            ],
            env=self.env,
            cwd=self.work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=3600,
        )
        logs = self.work / "runs" / run_id / "logs"
        reached = sum(
            f"hello from rank {r}" in _read(logs / f"rank-{r}.log") for r in range(len(self.behind))
        )
        self.record(name, started, reached, done.returncode)
        if done.returncode:  # why, in the launch's own words: its summary ends combined.log
            say("    " + "\n    ".join(_read(logs / "combined.log").splitlines()[-4:]))


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def main() -> None:
    args = parser(__doc__.splitlines()[0], "250", 3)
    args.add_argument("--launch-rounds", type=int, default=1, metavar="N")
    options = args.parse_args()
    say(machine_line())
    for n in options.nodes:
        with (
            scratch("orchestrator-jump-") as work,
            lab_cluster(n + 1, plain_home=work / "home", apart=True, beside=1) as cluster,
        ):
            cluster.use_stock_limits(cluster.nodes[0])
            measure(Bench(cluster, work), options)


def measure(bench: Bench, options) -> None:
    n = len(bench.behind)
    say(f"{n} nodes behind {bench.jump.name} (sshd with OpenSSH's stock MaxStartups)")
    steps = [
        lambda: bench.exec("exec via jump", bench.jump_config),
        lambda: bench.exec("exec direct", bench.direct_config),
        lambda: bench.ssh_each("ssh via jump", []),
        bench.pdsh,
        bench.multiplexed,
    ]
    for round_ in range(options.repeat):
        for step in steps[round_ % len(steps) :] + steps[: round_ % len(steps)]:
            step()
    pair = [
        lambda: bench.launch("launch via jump", bench.jump_config),
        lambda: bench.launch("launch direct", bench.direct_config),
    ]
    for round_ in range(options.launch_rounds):
        for step in pair if round_ % 2 == 0 else pair[::-1]:
            step()
    rows = []
    for name, times in bench.times.items():
        base = "launch direct" if name.startswith("launch") else "exec direct"
        reached, codes = bench.reached[name], bench.codes[name]
        rows.append(
            [
                name,
                f"{min(reached)}-{max(reached)}",
                f"{sum(r == n and not c for r, c in zip(reached, codes, strict=True))}"
                f"/{len(reached)}",
                spread(times),
                ratio(times, bench.times.get(base, [])),
            ]
        )
    say(f"\n{n} nodes, {options.repeat} repetitions, {options.launch_rounds} launch rounds")
    columns = ["contender", "reached", "runs reaching all, exit 0", "wall s", "vs direct"]
    say(table(columns, rows))
    say("command: " + shlex.join(["python", "benchmarks/jump_host.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
