"""What the node agent costs under SLURM: the time to a trainer's first step, and the
controller's CPU while the job runs and prints nothing.

    python benchmarks/slurm_agents.py [--repeat 5] [--nodes 2,4,8] [--windows 3] [--seconds 30]
    (as root: it builds a namespace cluster with a private SLURM over its nodes, tests/lab)

1. Start. `orchestrator render --backend slurm` writes job.sbatch for a 2-node run of the
   bundled trainer (small synthetic data, --log-every 1); a copy of it whose srun line runs
   `bash -c orchestrator_node` instead of `bash -c orchestrator_agent` is the path before the
   agent (torchrun as srun's task). Both are submitted by hand (sbatch, no run record: the
   output goes to slurm-JOB.out), alternating, --repeat times each after one warm-up of
   each, and timed from sbatch to the first `step 1/` line in slurm-JOB.out (and, to see
   where a difference comes from, to both nodes' line just before their torchrun starts, as
   it reaches the file: through the agent, in the agent's case). Printed: medians, the
   ratios agent / before, and the median of each round's own ratio. Target: the first step
   at most 1.1x.
2. Idle. `orchestrator launch --backend slurm --detach` of a job whose one rank per node
   prints a line and sleeps, at each of --nodes; once every rank has printed and the
   `srun --overlap` step over the nodes (the controller's way to the agents) runs, the CPU (user +
   system, from /proc) over --windows windows of --seconds of: the detached controller (its
   main thread, which follows the job: squeue every 30 s while every agent answers, the
   nodes' files every 1 s while they rest, orchestrator/slurm/following/cadence.py; and its other
   threads, which read the agents' frames), the commands it ran and waited for in the
   window (squeue), and its srun processes with their children. Printed per window, and
   the medians per node per 30 s, with the most srun processes on this host, controller
   threads and resident memory a window ended with. Target: the total within 2 ms per node
   per 30 s (as over SSH, benchmarks/idle_controller.py); srun processes at most 2.
   --repeat 0 leaves part 1 out.
The machine has few cores and may be shared: the ratios of one run matter most.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import defaultdict
from pathlib import Path

from common import (
    ORCHESTRATOR,
    SLEEPING,
    TICK,
    lab_cluster,
    machine_line,
    median,
    parser,
    ratio,
    say,
    scratch,
    spread,
    table,
    wait_until,
)

TRAINER = ["-m", "orchestrator.trainer", "--synthetic-samples", "256", "--max-steps", "2"]
TRAINER += ["--log-every", "1", "--no-eval"]
FIRST_STEP = "step 1/"
TORCHRUN = "orchestrator: NCCL/gloo interface"  # each node's part, just before its torchrun
AGENT_TASK, NODE_TASK = "bash -c orchestrator_agent", "bash -c orchestrator_node"
PER = 30.0  # the target's window, seconds


# ----- 1. the time to the first step --------------------------------------------------------


def render_both(slurm, work: Path) -> dict[str, Path]:
    """job.sbatch as rendered now ("agent"), and the same with torchrun as srun's task
    ("before")."""
    argv = [*ORCHESTRATOR, "render", "--backend", "slurm", "--nodes", "2", "--partition"]
    argv += [slurm.partition, "-o", "out", "--run-id", "first-step", "--", *TRAINER]
    subprocess.run(argv, cwd=work, env=slurm.environ(), check=True, capture_output=True)
    agent = work / "out" / "job.sbatch"
    text = agent.read_text()
    srun_lines = [line for line in text.splitlines() if line.startswith("srun ")]
    if len(srun_lines) != 1 or AGENT_TASK not in srun_lines[0]:
        raise SystemExit(f"job.sbatch's srun line is not as expected: {srun_lines}")
    before = work / "out" / "before.sbatch"
    before.write_text(text.replace(srun_lines[0], srun_lines[0].replace(AGENT_TASK, NODE_TASK)))
    return {"agent": agent, "before": before}


def time_to_first_step(slurm, work: Path, script: Path) -> tuple[float, float]:
    """Seconds from sbatch to both nodes' torchrun starting (the line the node part prints
    just before it) and to the first step's line, in slurm-JOB.out; waits for the job's end
    and the nodes' return to idle."""
    started = time.monotonic()
    job_id = slurm.sbatch(script, cwd=work)
    out = work / f"slurm-{job_id}.out"
    torchrun = None
    while True:
        text = out.read_text(errors="replace") if out.exists() else ""
        if torchrun is None and text.count(TORCHRUN) >= 2:
            torchrun = time.monotonic() - started
        if FIRST_STEP in text:
            stepped = time.monotonic() - started
            break
        if time.monotonic() - started > 600:
            raise SystemExit(f"job {job_id}: no first step after 600 s:\n{text[-3000:]}")
        time.sleep(0.02)
    info = slurm.wait_job(job_id, timeout=300)
    if (info.get("JobState"), info.get("ExitCode")) != ("COMPLETED", "0:0"):
        raise SystemExit(f"job {job_id} of {script.name} ended {info}:\n{out.read_text()[-3000:]}")
    slurm.wait_idle(timeout=120)
    return torchrun if torchrun is not None else float("nan"), stepped


def first_steps(slurm, work: Path, repeat: int) -> dict[str, dict[str, list[float]]]:
    """{variant: {"torchrun": [s, ...], "step": [s, ...]}}"""
    scripts = render_both(slurm, work)
    for name, script in scripts.items():  # a fresh cluster's first jobs start slower
        _, stepped = time_to_first_step(slurm, work, script)
        say(f"  warm-up: {name:6} first step after {stepped:.2f} s")
    took: dict[str, dict[str, list[float]]] = {n: {"torchrun": [], "step": []} for n in scripts}
    for i in range(repeat):
        # Each goes first every other round, so that a drift in load hits both alike.
        for name in list(scripts)[:: 1 if i % 2 == 0 else -1]:
            torchrun, stepped = time_to_first_step(slurm, work, scripts[name])
            took[name]["torchrun"].append(torchrun)
            took[name]["step"].append(stepped)
            say(f"  round {i + 1}: {name:6} torchruns {torchrun:.2f} s, first step {stepped:.2f} s")
    return took


# ----- 2. the controller's CPU while idle ---------------------------------------------------


def processes() -> dict[int, tuple[int, str, float, float]]:
    """Every live process: pid -> (ppid, name, own CPU s, waited-for children's CPU s)."""
    table_ = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # ended meanwhile
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        table_[int(entry)] = (
            int(fields[1]),
            name,
            (int(fields[11]) + int(fields[12])) / TICK,
            (int(fields[13]) + int(fields[14])) / TICK,
        )
    return table_


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU s of a process's main thread, and of its other threads together."""
    main = others = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used = (int(fields[11]) + int(fields[12])) / TICK
        if int(tid) == pid:
            main = used
        else:
            others += used
    return main, others


def controller_cpu(pid: int) -> dict[str, float]:
    """CPU s so far of the controller's parts: its main thread, its other threads, the
    commands it ran and waited for (squeue; their CPU lands in its own record when they
    end, so one still running is counted with them), and its srun processes (each with its
    children, waited for or still running)."""
    table_ = processes()
    children = defaultdict(list)
    for child, (parent, *_rest) in table_.items():
        children[parent].append(child)

    def subtree(root: int) -> float:
        _, _, own, waited = table_[root]
        return own + waited + sum(subtree(child) for child in children[root])

    def sruns(root: int) -> int:
        return (table_[root][1] == "srun") + sum(sruns(child) for child in children[root])

    main, others = thread_cpu(pid)
    spent = {"main": main, "threads": others, "waited": table_[pid][3], "srun": 0.0, "sruns": 0}
    for child in children[pid]:
        if table_[child][1] == "srun":
            spent["srun"] += subtree(child)
            spent["sruns"] += sruns(child)  # srun and the child it forks
        else:
            spent["waited"] += subtree(child)
    return spent


def footprint(pid: int) -> tuple[int, float]:
    """The controller's thread count and resident memory (MB)."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(status["Threads"]), int(status["VmRSS"].split()[0]) / 1024


PARTS = ("main", "threads", "waited", "srun")


def idle_cost(slurm, work: Path, n: int, windows: int, seconds: float) -> list[dict[str, float]]:
    """The controller's CPU ms in each window, by part, of a detached launch of `n` nodes
    whose ranks sleep; each window also counts the srun processes on this host, the
    controller's threads and its resident memory (MB) at its end."""
    run_id, runs = f"idle-{n}", work / "runs"
    (work / "sleeping.py").write_text(SLEEPING.format(seconds=windows * seconds + 1800))
    argv = [*ORCHESTRATOR, "launch", "--backend", "slurm", "--detach", "--nodes", str(n)]
    argv += ["--nproc-per-node", "1", "--partition", slurm.partition, "--run-dir", str(runs)]
    argv += ["--run-id", run_id, "--color", "never", "--", "sleeping.py"]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=work, env=slurm.environ(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the detached launch failed:\n{done.stdout}{done.stderr}")
    try:
        combined = runs / run_id / "logs" / "combined.log"

        def all_sleeping() -> bool:
            return combined.exists() and combined.read_text(errors="replace").count("sleeping") >= n

        wait_until(all_sleeping, 600, f"{n} ranks sleeping ({combined})", poll=0.2)
        pid = json.loads((runs / run_id / "status.json").read_text())["controller"]["pid"]
        wait_until(lambda: controller_cpu(pid)["sruns"] >= 1, 120, "the agents' step", poll=0.2)
        say(f"{n} nodes: every rank sleeps after {time.monotonic() - started:.0f} s")
        time.sleep(5)  # the start's last work (the agents' first frames) passes
        spent = []
        for _ in range(windows):
            before = controller_cpu(pid)
            time.sleep(seconds)
            after = controller_cpu(pid)
            spent.append({part: (after[part] - before[part]) * 1000 for part in PARTS})
            threads, rss = footprint(pid)
            say(
                f"  {seconds:g} s: "
                + ", ".join(f"{part} {ms:.0f} ms" for part, ms in spent[-1].items())
                + f"; total {sum(spent[-1].values()):.0f} ms"
                + f" (load average {os.getloadavg()[0]:.1f}); {after['sruns']} srun "
                f"processes, controller {threads} threads, {rss:.0f} MB resident"
            )
            spent[-1].update(sruns=after["sruns"], thread_count=threads, rss=rss)
        return spent
    finally:
        stop = [*ORCHESTRATOR, "stop", run_id, "--run-dir", str(runs), "--wait", "120"]
        subprocess.run(stop, cwd=work, env=slurm.environ(), capture_output=True, timeout=300)
        slurm.wait_idle(timeout=120)


# ----- the run ------------------------------------------------------------------------------


def main() -> int:
    cli = parser(__doc__.splitlines()[0], "2,4,8", 5)
    cli.add_argument("--windows", type=int, default=3, help="idle windows per node count (3)")
    cli.add_argument("--seconds", type=float, default=PER, help="one idle window (30)")
    args = cli.parse_args()
    from tests.lab import make_slurm  # after common, which puts the repository on sys.path

    say(machine_line())
    with (
        scratch("orchestrator-bench-slurm-agents-") as work,
        lab_cluster(max([2, *args.nodes])) as cluster,
        make_slurm(cluster) as slurm,
    ):
        say(f"1. time to the first step, 2-node trainer, {args.repeat} rounds")
        took = first_steps(slurm, work, args.repeat) if args.repeat else {}
        say(f"2. idle controller, {args.windows} windows of {args.seconds:g} s")
        idle = {n: idle_cost(slurm, work, n, args.windows, args.seconds) for n in args.nodes}

    if took:
        say_first_steps(took)
    say_idle(idle, args.seconds)
    return 0


def say_first_steps(took: dict[str, dict[str, list[float]]]) -> None:
    say("\n1. 2 nodes, seconds from sbatch to lines in slurm-JOB.out: median (min-max)")
    rows = []
    for name, task in (("before", "orchestrator_node (before)"), ("agent", "orchestrator_agent")):
        rows.append([task, spread(took[name]["torchrun"]), spread(took[name]["step"])])
    rows.append(
        [
            "agent / before",
            ratio(took["agent"]["torchrun"], took["before"]["torchrun"]),
            ratio(took["agent"]["step"], took["before"]["step"]),
        ]
    )
    say(table(["srun's task", "both torchruns start", "first step"], rows))
    slower = median(took["agent"]["step"]) / median(took["before"]["step"])
    say(f"first step, target <= 1.10x: {'met' if slower <= 1.10 else 'NOT met'} ({slower:.3f}x)")
    rounds = zip(took["agent"]["step"], took["before"]["step"], strict=True)
    say(f"  (median of the rounds' own ratios: {median([a / b for a, b in rounds]):.3f}x)")


def say_idle(idle: dict[int, list[dict[str, float]]], seconds: float) -> None:
    scale = PER / seconds
    say(f"\n2. idle controller CPU, ms per node per {PER:g} s (median of the windows)")
    totals = {
        n: median([sum(w[p] for p in PARTS) for w in spent]) * scale for n, spent in idle.items()
    }
    rows = []
    for n, spent in idle.items():
        per_node = [median([w[p] for w in spent]) * scale / n for p in PARTS]
        verdict = "met" if totals[n] / n <= 2 else "NOT met"
        most = [max(w[key] for w in spent) for key in ("sruns", "thread_count", "rss")]
        rows.append(
            [n, *(f"{ms:.2f}" for ms in per_node), f"{totals[n] / n:.2f}", verdict]
            + [f"{most[0]:.0f}", f"{most[1]:.0f}", f"{most[2]:.0f}"]
        )
    headers = ["nodes", "main thread", "reader threads", "squeue (waited)", "srun steps"]
    headers += ["total", "target <= 2", "srun processes", "threads", "RSS MB"]
    say(table(headers, rows))
    if len(idle) > 1:
        low, high = min(idle), max(idle)
        added = (totals[high] - totals[low]) / (high - low)
        say(
            f"each node added from {low} to {high} nodes: {added:.2f} ms per {PER:g} s "
            f"(target <= 2: {'met' if added <= 2 else 'NOT met'}); the rest, "
            f"{totals[low] - added * low:.0f} ms per {PER:g} s, is the controller's whatever "
            "the node count"
        )


if __name__ == "__main__":
    raise SystemExit(main())
