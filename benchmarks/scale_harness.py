"""A job of many simulated nodes on this machine, the controller unchanged.

The real node agent runs on every simulated node, with a stub torchrun and rank program
that cost little.

    python benchmarks/scale_harness.py [--nodes 16,128,1000] [--ranks 8] [--repeat 3]
        [--idle 30] [--lines 60]

A node is a loopback address (127.1.x.y): the controller reaches it through its local
transport (a subprocess per node, no sshd), and runs on it what it runs on any node: the
node agent (the real one, sent as it is over SSH), the rendered node script, torchrun and
the ranks. What is stubbed is what the node script starts (benchmarks/stub_node/): its
hostfile `python=` is a shim that runs the real interpreter for the agent and the probe,
the real interpreter with a stub `torch` for torchrun (torch.distributed.run: bash that
starts the node's ranks with torchrun's variables, and on node 0 a listener for the store
the other nodes wait for), and bash for the rank program (rank.sh: stamps its start,
prints, sleeps without a process per tick). No torch is imported anywhere.

For each node count, in one run (the figures beside each other, so the growth shows):
- start: `orchestrator launch` of an idle job, --repeat times; from the last agent's
  process start (from /proc) to the last rank's stamp, and from the command's start; and
  the CPU spent until then, per node: the controller's, and the nodes' (this machine's
  less the controller's). This machine's cores do every node's start (its agent, node
  script, torchrun and ranks) one after another, which a real cluster's nodes do each on
  their own: the controller's CPU is the part that does not spread over the nodes;
- idle: on the last of those runs, once the start's load has passed, the controller's
  CPU over --idle s (target: at most 2 ms per node per 30 s), its resident memory and
  threads, and the memory all the nodes' processes hold;
- lost: every process of one node killed at once (as a power loss leaves them): the time
  until the console names it lost, and that it names no other node; then the run stops
  and nothing of it is left anywhere;
- lines: a job whose every rank prints a line a second for --lines s and ends: every
  rank's file and the console hold each line once (none lost, none doubled), and the
  controller's CPU over that time as a share of one core (target: at most half). With
  --profile DIR, py-spy samples the controller meanwhile: its folded stacks go to DIR, and
  the functions that held the most samples are printed (--only lines skips the rest).
Not measured here: `stacks` (the rank stubs are bash, to fit thousands of ranks in this
machine's memory, and stacks are read from Python ranks) and a relay's loss (the local
transport has no relays). Exit 0 when every check held.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    ORCHESTRATOR,
    PYTHON,
    cpu_seconds,
    inotify_room,
    machine_line,
    median,
    parser,
    read_stamps,
    remove_node_dirs,
    say,
    scratch,
    table,
)

STUB = Path(__file__).resolve().parent / "stub_node"
AGENT_WORD = "orchestrator-agent"
BOOT_TIME = next(
    float(line.split()[1])
    for line in Path("/proc/stat").read_text().splitlines()
    if line.startswith("btime ")
)
TICK = os.sysconf("SC_CLK_TCK")
LINE = re.compile(rb"line (\d+) of rank (\d+)")
FRAME_LINE = re.compile(r":\d+\)$")


def addresses(n: int) -> list[str]:
    """n loopback addresses, none of them 127.0.0.1 (which names this machine itself)."""
    return [f"127.1.{i // 250}.{i % 250 + 1}" for i in range(n)]


def master_address() -> str:
    """An address of this machine that is not loopback (a multi-node plan refuses one)."""
    for word in subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split():
        if ":" not in word:
            return word
    raise SystemExit("scale_harness: this machine has no IPv4 address but loopback")


@dataclass
class Proc:
    pid: int
    ppid: int
    start: float  # wall clock
    cmdline: list[str]


def processes() -> dict[int, Proc]:
    found: dict[int, Proc] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if stat[0] == "Z":
            continue
        cmdline = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
        start = BOOT_TIME + int(stat[19]) / TICK
        found[int(entry)] = Proc(int(entry), int(stat[1]), start, cmdline)
    return found


def start_timeout(n: int) -> float:
    """How long n nodes' ranks may take to start: this machine's cores start every node."""
    return 120 + n * 0.6


def is_agent(proc: Proc, run_id: str) -> bool:
    return proc.cmdline[-2:] == [AGENT_WORD, run_id]


def agents_of(run_id: str, table_: dict[int, Proc]) -> list[Proc]:
    return [p for p in table_.values() if is_agent(p, run_id)]


def descendants(root: int, table_: dict[int, Proc]) -> list[int]:
    children: dict[int, list[int]] = {}
    for proc in table_.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def left_of(run_id: str) -> list[int]:
    """Processes of the run still alive anywhere: its agents and whatever they started
    (the agent's environment, and so every descendant's, holds ORCHESTRATOR_RUN_ID)."""
    mark = f"ORCHESTRATOR_RUN_ID={run_id}".encode()
    left = []
    for pid, proc in processes().items():
        if pid == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if mark in environ.split(b"\0") or is_agent(proc, run_id):
            left.append(pid)
    return left


@dataclass
class Job:
    """One `orchestrator launch` on the simulated nodes."""

    work: Path
    hosts: list[str]
    ranks: int
    run_id: str
    program: list[str]
    started: float = 0.0
    proc: subprocess.Popen | None = None
    out: Path = field(init=False)

    def __post_init__(self) -> None:
        self.out = self.work / f"{self.run_id}.console"
        self.stamps = self.work / f"{self.run_id}.stamps"

    def __enter__(self) -> Job:
        self.start()
        return self

    def __exit__(self, kind, value, traceback) -> None:
        """A measurement that failed leaves nothing running, and says what the console
        said last (the scratch folder that holds it goes next)."""
        if kind is None:
            return
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.nothing_left(30)
        say(f"{self.run_id}: the console's last lines:\n{self.console()[-3000:]}")

    def start(self) -> None:
        hostfile = self.work / "hosts.txt"
        python = STUB / "python"
        hostfile.write_text(
            "".join(f"{h} slots={self.ranks} python={python}\n" for h in self.hosts)
        )
        argv = [
            *ORCHESTRATOR, "launch", str(hostfile), "--run-dir", str(self.work / "runs"),
            "--run-id", self.run_id, "--color", "never", "--master-addr", master_address(),
            "--", str(STUB / "rank.sh"), str(self.stamps), *self.program,
        ]  # fmt: skip
        env = {**os.environ, "SCALE_HARNESS_PYTHON": PYTHON}
        self.started = time.time()
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(argv, cwd=self.work, env=env, stdout=out, stderr=out)

    def console(self) -> str:
        return self.out.read_text(errors="replace")

    def ranks_started(self) -> dict[str, float]:
        return read_stamps(self.stamps)

    def wait_ranks(self, timeout: float) -> float:
        """Wait for every rank's stamp; the last stamp's time."""
        want = len(self.hosts) * self.ranks
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stamps = self.ranks_started()
            if len(stamps) >= want:
                return max(stamps.values())
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"{self.run_id}: the launch ended first:\n{self.console()[-3000:]}"
                )
            time.sleep(0.5)
        raise SystemExit(
            f"{self.run_id}: {len(self.ranks_started())} of {want} ranks started in {timeout:g} s"
        )

    def stop(self, timeout: float) -> int:
        """Ctrl-C, as a user stops it; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.wait(timeout)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise SystemExit(
                f"{self.run_id}: the controller did not end in {timeout:g} s"
            ) from None

    def nothing_left(self, within: float) -> list[int]:
        deadline = time.monotonic() + within
        while (left := left_of(self.run_id)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:  # so that the next measurement starts clean
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return left


@dataclass
class Figures:
    start_from_agents: list[float] = field(default_factory=list)
    start_from_command: list[float] = field(default_factory=list)
    start_cpu: list[float] = field(default_factory=list)  # the controller's, s
    start_machine_cpu: list[float] = field(default_factory=list)  # everything's, s
    idle_cpu_ms: float = float("nan")
    rss_mb: float = float("nan")
    threads: int = 0
    nodes_mb: float = float("nan")
    lost_after: float = float("nan")
    lines_cpu: float = float("nan")
    failures: list[str] = field(default_factory=list)


def settle(limit: float) -> None:
    """Wait (up to `limit` s) for the 1-minute load average to fall below the cores."""
    deadline, cores = time.monotonic() + limit, os.cpu_count() or 1
    while os.getloadavg()[0] > cores and time.monotonic() < deadline:
        time.sleep(5)


def machine_cpu() -> float:
    """CPU seconds this machine has spent busy (every process, all cores) since boot."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    idle = int(fields[3]) + int(fields[4])  # idle, iowait
    return (sum(int(f) for f in fields[:8]) - idle) / TICK


def memory_used_mb() -> float:
    """This machine's memory in use (total less available), MB."""
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info[key] = int(value.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / 1024


def status_of(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def measure(n: int, args, work: Path, figures: Figures) -> None:
    hosts = addresses(n)
    idle_memory = memory_used_mb()
    for round_ in range(1, 0 if args.only == "lines" else args.repeat + 1):
        busy = machine_cpu()
        with Job(work, hosts, args.ranks, f"scale{n}-{round_}", ["idle"]) as job:
            measure_round(job, round_, args, figures, busy, idle_memory)
        remove_node_dirs([job.run_id])
    lines(n, args, work, hosts, figures)


def measure_round(
    job: Job, round_: int, args, figures: Figures, busy: float, idle_memory: float
) -> None:
    """One start, stopped; the last round's run idles and then loses a node instead."""
    n = len(job.hosts)
    last_rank = job.wait_ranks(start_timeout(n))
    figures.start_cpu.append(cpu_seconds(job.proc.pid))
    figures.start_machine_cpu.append(machine_cpu() - busy)
    agents = agents_of(job.run_id, processes())
    if len(agents) != n:
        figures.failures.append(f"{job.run_id}: {len(agents)} agents for {n} nodes")
    up = max(a.start for a in agents)
    figures.start_from_agents.append(last_rank - up)
    figures.start_from_command.append(last_rank - job.started)
    say(
        f"  {job.run_id}: every rank started {last_rank - up:.1f} s after the last agent"
        f" ({last_rank - job.started:.1f} s after the command); CPU until then: the"
        f" controller's {figures.start_cpu[-1]:.1f} s, this machine's"
        f" {figures.start_machine_cpu[-1]:.1f} s"
    )
    if round_ < args.repeat:
        code = job.stop(start_timeout(n))
        if code not in (130, 1) or job.nothing_left(30):
            figures.failures.append(f"{job.run_id}: stop exit {code} or processes left")
        return
    settle(args.settle)
    pid = job.proc.pid
    before = cpu_seconds(pid)
    time.sleep(args.idle)
    figures.idle_cpu_ms = (cpu_seconds(pid) - before) * 1000
    status = status_of(pid)
    figures.rss_mb = int(status["VmRSS"].split()[0]) / 1024
    figures.threads = int(status["Threads"])
    table_ = processes()
    mine = {q for a in agents_of(job.run_id, table_) for q in descendants(a.pid, table_)}
    figures.nodes_mb = memory_used_mb() - idle_memory - figures.rss_mb
    say(
        f"  idle: {figures.idle_cpu_ms:.0f} ms of controller CPU in {args.idle:g} s; "
        f"controller {figures.rss_mb:.0f} MB resident, {figures.threads} threads; "
        f"the nodes' {len(mine)} processes {figures.nodes_mb:.0f} MB (this machine's "
        f"memory in use, less the controller's, against before the first run)"
    )
    kill_one(job, figures)


def kill_one(job: Job, figures: Figures) -> None:
    """Every process of the middle node, killed at once (frozen first, so none reparents
    or restarts another while the rest die)."""
    table_ = processes()
    hosts = job.hosts
    victim_rank = len(hosts) // 2
    dir_word = f"/{job.run_id}/node{victim_rank}/"
    agent = next(
        a
        for a in agents_of(job.run_id, table_)
        if any(dir_word in " ".join(table_[q].cmdline) for q in descendants(a.pid, table_))
    )
    victim = hosts[victim_rank]
    doomed = descendants(agent.pid, table_)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in doomed:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    killed = time.monotonic()
    said = f"{victim}: lost:"
    while said not in job.console() and job.proc.poll() is None:
        if time.monotonic() - killed > 120:
            break
        time.sleep(0.1)
    figures.lost_after = time.monotonic() - killed if said in job.console() else float("inf")
    code = job.wait(300)
    console = job.console()
    others = [
        line
        for line in console.splitlines()
        if ": lost:" in line and not line.startswith(f"[orchestrator] {victim}: lost:")
    ]
    left = job.nothing_left(30)
    say(
        f"  lost: {victim} named lost {figures.lost_after:.1f} s after its processes were"
        f" killed; other nodes named lost: {len(others)}; exit {code}; left running: {len(left)}"
    )
    if others or code != 1 or left or figures.lost_after == float("inf"):
        figures.failures.append(f"{job.run_id}: lost {others[:3]} exit {code} left {len(left)}")


def profiled(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    """py-spy sampling `pid` for `seconds` into `out`: the thread that holds the interpreter
    lock at each sample (a thread waiting in epoll or a lock can read as busy otherwise),
    folded stacks (one line per stack: frames outermost first, then its sample count)."""
    spy = Path(sys.executable).with_name("py-spy")
    command = [str(spy) if spy.exists() else "py-spy", "record", "--pid", str(pid)]
    command += ["--duration", str(int(seconds)), "--rate", "100", "--format", "raw"]
    command += ["--threads", "--gil", "--nonblocking", "--output", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def top_functions(folded: Path, count: int = 12) -> list[str]:
    """The functions of `folded` that held the most samples, innermost frame (self) and
    anywhere on the stack (total), as lines."""
    own, anywhere, total = Counter(), Counter(), 0
    for line in folded.read_text(errors="replace").splitlines():
        stack, _, samples = line.rpartition(" ")
        if not samples.isdigit():
            continue
        # The first is the thread; a frame's line number is left out (functions, not lines).
        frames = [FRAME_LINE.sub(")", f.strip()) for f in stack.split(";")[1:]]
        total += int(samples)
        if frames:
            own[frames[-1]] += int(samples)
        for name in set(frames):
            anywhere[name] += int(samples)
    if not total:
        return ["  profile: no samples"]
    found = [f"  profile: {total} samples; self %, total %, function"]
    for name, samples in own.most_common(count):
        found.append(f"  {100 * samples / total:5.1f} {100 * anywhere[name] / total:5.1f}  {name}")
    return found


def lines(n: int, args, work: Path, hosts: list[str], figures: Figures) -> None:
    with Job(work, hosts, args.ranks, f"scale{n}-lines", ["lines", str(args.lines)]) as job:
        count_lines(job, args, figures)
    remove_node_dirs([job.run_id])


def count_lines(job: Job, args, figures: Figures) -> None:
    """Every rank's lines, in its file and on the console, each once; the controller's CPU
    while they came."""
    n = len(job.hosts)
    job.wait_ranks(start_timeout(n))
    pid = job.proc.pid
    spy = None
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        folded = args.profile / f"lines-{n}.folded"
        spy = profiled(pid, args.lines - 2, folded)
    began, before = time.monotonic(), cpu_seconds(pid)
    last = (began, before)
    while job.proc.poll() is None:
        try:
            last = (time.monotonic(), cpu_seconds(pid))
        except OSError:
            break
        time.sleep(0.5)
    figures.lines_cpu = (last[1] - before) / max(1e-9, last[0] - began)
    code = job.wait(60)
    if spy is not None:
        _, err = spy.communicate(timeout=60)
        if spy.returncode or not folded.exists():
            say(f"  profile: py-spy failed ({spy.returncode}): {err.decode()[-300:]}")
        else:
            say(f"  profile of the controller ({folded}):")
            for line in top_functions(folded):
                say(line)
    want = {(i, r) for r in range(n * args.ranks) for i in range(1, args.lines + 1)}
    problems = []
    files = Counter()
    for r in range(n * args.ranks):
        path = job.work / "runs" / job.run_id / "logs" / f"rank-{r}.log"
        text = path.read_bytes() if path.exists() else b""
        files.update((int(i), int(k)) for i, k in LINE.findall(text))
    console = Counter((int(i), int(k)) for i, k in LINE.findall(job.out.read_bytes()))
    for where, seen in (("rank files", files), ("console", console)):
        lost = len(want - set(seen))
        doubled = sum(1 for key, count in seen.items() if count > 1)
        say(
            f"  lines ({where}): {sum(seen.values())} of {len(want)}; "
            f"lost {lost}, doubled {doubled}"
        )
        if lost or doubled:
            problems.append(f"{where}: lost {lost} doubled {doubled}")
    say(
        f"  lines: controller CPU {figures.lines_cpu:.2f} of a core while "
        f"{n * args.ranks} ranks printed a line a second; exit {code}"
    )
    left = job.nothing_left(30)
    if code != 0 or problems or left:
        figures.failures.append(f"{job.run_id}: exit {code}, {problems}, {len(left)} left")


def main() -> int:
    cli = parser(__doc__.splitlines()[0], "16,128,1000", 3)
    cli.add_argument("--ranks", type=int, default=8, help="ranks per node (8)")
    cli.add_argument("--idle", type=float, default=30, help="the idle window, s (30)")
    cli.add_argument("--lines", type=int, default=60, help="s of a line a second (60)")
    cli.add_argument(
        "--settle", type=float, default=300, help="s to wait at most for the load to pass (300)"
    )
    cli.add_argument("--only", choices=("lines",), help="run only this part (lines)")
    cli.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="sample the controller with py-spy while the lines come; folded stacks in DIR",
    )
    args = cli.parse_args()
    # Stopped from outside (a `timeout`), the job's own exit still stops its launch.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    say(machine_line())
    results: dict[int, Figures] = {}
    for n in args.nodes:
        say(f"{n} nodes x {args.ranks} ranks:")
        results[n] = Figures()
        with inotify_room(n), scratch("orchestrator-bench-scale-") as work:
            measure(n, args, work, results[n])
    rows = []
    for n, f in results.items():
        rows.append(
            [
                n,
                n * args.ranks,
                f"{median(f.start_from_agents):.1f} ({median(f.start_from_command):.1f})",
                f"{median(f.start_cpu) / n * 1000:.1f}",
                f"{(median(f.start_machine_cpu) - median(f.start_cpu)) / n * 1000:.0f}",
                f"{f.idle_cpu_ms / n * 30 / args.idle:.2f}",
                f"{f.rss_mb:.0f} ({f.rss_mb / n * 1024:.0f} KB/node)",
                f.threads,
                f"{f.nodes_mb / n:.1f}",
                f"{f.lost_after:.1f}",
                f"{f.lines_cpu:.2f}",
            ]
        )
    say("")
    say(
        table(
            [
                "nodes",
                "ranks",
                "all started s p50 (from command)",
                "start CPU ms/node: controller",
                "start CPU ms/node: nodes",
                "idle CPU ms/node/30 s",
                "controller MB",
                "threads",
                "node MB",
                "lost named s",
                "lines: cores",
            ],
            rows,
        )
    )
    failures = [f"{n} nodes: {what}" for n, f in results.items() for what in f.failures]
    for line in failures:
        say(f"FAILED {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
