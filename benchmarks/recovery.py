"""Recovery from a lost node: time from the fault to the first training step after resume.

4 namespace nodes, `launch --spares 1` (3 run, 1 spare), the bundled trainer with a
checkpoint every 10 steps. Once the first checkpoint is written, node 2 is switched off
(link down, every process SIGKILLed). The controller's console lines, time-stamped as they
arrive, split the time from the fault to rank 0's first step after resume into:

  detection  fault -> "NODE: lost" (the heartbeat timeout bounds it)
  stop       -> attempt 1 has ended on every node (the others stopped, SIGKILL after --grace)
  re-probe   -> attempt 2 starts (the spare and the master probed, plan, scripts)
  restart    -> every node of attempt 2 runs (status.json: running_again_at)
  resume     -> rank 0's first step after resume (torch import, rendezvous, checkpoint load)

Baseline, in the same run: what a person would do by hand without --spares, less their own
reaction time: a fresh `launch --resume` on three healthy nodes from the same checkpoint
directory, from the command to its first step. Medians (min-max) of --repeat runs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

from common import (
    ORCHESTRATOR,
    lab_cluster,
    machine_line,
    median,
    parser,
    remove_node_dirs,
    say,
    scratch,
    spread,
    table,
    wait_until,
)

TRAIN = [
    "--synthetic-samples", "2048", "--batch-size", "8", "--epochs", "2", "--no-eval",
    "--checkpoint-every", "10", "--log-every", "1",
]  # fmt: skip
STEP = re.compile(r"\[\S+ r0\] step \d+/")
PHASES = ("detection", "stop", "re-probe", "restart", "resume")


class Console:
    """A started command's output lines, each with the wall time it arrived."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def first(self, pattern: str | re.Pattern[str], after: float = 0.0) -> float | None:
        return next((t for t, line in self.lines if t >= after and re.search(pattern, line)), None)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return code


def launch_argv(hostfile: Path, runs: Path, run_id: str, ckpt: Path, heartbeat: float, *extra):
    return [
        *ORCHESTRATOR, "launch", str(hostfile), "--run-dir", str(runs), "--run-id", run_id,
        "--color", "never", "--env=OMP_NUM_THREADS=1", "--heartbeat-timeout", str(heartbeat),
        "--grace", "3", *extra, "--", "-m", "orchestrator.trainer", *TRAIN,
        "--checkpoint-dir", str(ckpt), "--resume",
    ]  # fmt: skip


def one_fault(cluster, work: Path, rep: int, heartbeat: float) -> dict[str, float]:
    from tests.lab import bad_days

    run_id, ckpt = f"recovery-{rep}", work / f"ckpt-{rep}"
    hostfile = cluster.write_hostfile(work / "hosts.txt", slots=1)
    victim = cluster.nodes[2]
    console = Console(
        launch_argv(hostfile, work / "runs", run_id, ckpt, heartbeat, "--spares", "1"),
        work,
        cluster.environ(),
    )
    try:
        wait_until(lambda: any(ckpt.glob("ckpt-*.pt")), 300, "the first checkpoint", poll=0.05)
        shutil.copytree(ckpt, work / f"ckpt-{rep}-by-hand")  # for the baseline, mid-training
        with bad_days.powered_off(cluster, victim):
            off = time.time()
            code = console.wait(timeout=600)
    finally:
        if console.proc.poll() is None:
            console.proc.kill()
    text = "\n".join(line for _, line in console.lines)
    if code != 0:
        raise SystemExit(f"the launch with a spare failed (exit {code}):\n{text[-3000:]}")
    status = json.loads((work / "runs" / run_id / "status.json").read_text())
    running = _wall(status["recoveries"][0]["running_again_at"])
    phases = fault_phases(console, victim.name, off, running, text)
    remove_node_dirs([run_id])
    return {**phases, "after detection": phases["total"] - phases["detection"]}


def fault_phases(console, victim: str, off: float, running: float, text: str) -> dict[str, float]:
    """From the node switched off (`off`) to the first training step of the next attempt,
    by the console's lines and the attempt's `running` time (wall clock)."""
    marks = {
        "lost": console.first(rf"{re.escape(victim)}: lost", off),
        "ended": console.first(r"attempt 1 ended by a node fault", off),
        "attempt2": console.first(r"\[orchestrator\] attempt 2: ", off),
    }
    marks["step"] = console.first(STEP, marks["attempt2"] or off)
    if any(value is None for value in marks.values()):
        raise SystemExit(f"a line is missing from the console ({marks}):\n{text[-3000:]}")
    return {
        "detection": marks["lost"] - off,
        "stop": marks["ended"] - marks["lost"],
        "re-probe": marks["attempt2"] - marks["ended"],
        "restart": running - marks["attempt2"],
        "resume": marks["step"] - running,
        "total": marks["step"] - off,
    }


def fresh_resume(cluster, work: Path, rep: int, heartbeat: float) -> float:
    """The baseline: a new launch on three healthy nodes resuming from rep's checkpoints."""
    run_id = f"by-hand-{rep}"
    hostfile = cluster.write_hostfile(work / "hosts-3.txt", cluster.nodes[:3], slots=1)
    start = time.time()
    console = Console(
        launch_argv(hostfile, work / "runs", run_id, work / f"ckpt-{rep}-by-hand", heartbeat),
        work,
        cluster.environ(),
    )
    first = wait_until(lambda: console.first(STEP), 300, "the first step", poll=0.02)
    console.proc.terminate()
    console.wait(timeout=60)
    remove_node_dirs([run_id])
    return first - start


def _wall(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def main() -> int:
    cli = parser(__doc__.splitlines()[0], "4", 3)
    cli.add_argument("--heartbeat-timeout", type=float, default=10, help="the launch's (10 s)")
    args = cli.parse_args()
    say(__doc__.split("\n\n", 1)[1].rstrip())
    say(machine_line())
    results: list[dict[str, float]] = []
    by_hand: list[float] = []
    with scratch("orchestrator-bench-recovery-") as work, lab_cluster(args.nodes[0]) as cluster:
        for rep in range(args.repeat):
            results.append(one_fault(cluster, work, rep, args.heartbeat_timeout))
            by_hand.append(fresh_resume(cluster, work, rep, args.heartbeat_timeout))
            say(
                f"run {rep + 1}: "
                + ", ".join(f"{k} {v:.1f} s" for k, v in results[-1].items())
                + f"; by hand {by_hand[-1]:.1f} s"
            )
    rows = [[phase, spread([r[phase] for r in results])] for phase in (*PHASES, "total")]
    rows.append(["fresh launch --resume (baseline)", spread(by_hand)])
    say(table(["from the fault", "seconds: median (min-max)"], rows))
    detection = median([r["detection"] for r in results])
    rest = median([r["after detection"] for r in results])
    ratio = rest / median(by_hand)
    passed = detection <= args.heartbeat_timeout + 2 and rest <= 20
    say(
        f"{'PASS' if passed else 'FAIL'}: detection {detection:.1f} s (heartbeat timeout "
        f"{args.heartbeat_timeout:g} s); detection to first step {rest:.1f} s (target 20 s), "
        f"{ratio:.2f}x a fresh launch --resume by hand"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
