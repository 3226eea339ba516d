"""What one hang check costs a rank: its two stacks and two readings of its main thread's CPU.

    python benchmarks/hang_check_cost.py [--checks 20]   (no cluster: one rank on this machine)

The rank: a main thread that works in small steps (about 0.1 ms of Python each) and notes
every gap between two steps longer than 0.5 ms, with its time (CLOCK_MONOTONIC, shared with
this process), while a logging thread prints a line every 2 s (to /dev/null). A check is
what the node's agent does for it (orchestrator.agent.stacks.take_stacks), twice: here
0.5 s apart instead of SAMPLE_GAP_S, which changes nothing of the cost. Each way is
measured in turn, py-spy then the ranks' signal hook:

  call     the wall time of one sample, as the agent waits for it
  agent    the CPU the sample cost the agent (this process: the call, /proc, starting py-spy)
  py-spy   the CPU py-spy itself used (a child process; the hook's work is inside the rank)
  stop     the longest gap in the rank's main thread while the sample was being taken (py-spy
           stops every thread of the rank while it reads; the hook runs in one thread and
           holds the GIL while it writes); gaps from the scheduler count too, so `quiet` is
           the same figure over as long a window without a sample, 0.2 s after each
  proc     reading the main thread's CPU (/proc/PID/task/PID/stat and schedstat)

Reported per rank per check (two samples), median and most over CHECKS checks. How often
checks come is the rule's (supervise/hangs.py): with lines flowing and no step reported, one
check every --hang-timeout + LULL_S + SAMPLE_GAP_S; with steps reported, none.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from common import machine_line, median, say, table  # noqa: E402

from orchestrator.agent.py_spy import find_py_spy  # noqa: E402
from orchestrator.agent.stacks import (  # noqa: E402
    HOOK_FOLDER,
    hook_environment,
    main_thread_cpu,
    take_stacks,
)

RANK = """\
import signal, sys, threading, time
def report_memory():
    while True:
        print("memory", flush=True)
        time.sleep(2)
gaps, last = [], time.monotonic()
def write_gaps(*_):
    with open(sys.argv[1], "w") as f:
        f.writelines(f"{at} {gap}\\n" for at, gap in gaps)
    sys.exit(0)
signal.signal(signal.SIGTERM, write_gaps)
threading.Thread(target=report_memory, daemon=True).start()
while True:
    sum(range(1000))
    now = time.monotonic()
    if now - last > 0.0005:
        gaps.append((now, now - last))
    last = now
"""
HOOK = str(REPO / "orchestrator" / "agent" / HOOK_FOLDER)


def cpu(who: int) -> float:
    used = resource.getrusage(who)
    return used.ru_utime + used.ru_stime


def measure(py_spy: str | None, checks: int, folder: Path) -> dict[str, list[float]]:
    """Per check, the two samples' (seconds): call time, the agent's CPU, py-spy's, the
    longest stop of each summed, the same without a sample, the two CPU readings' time."""
    script, hook_dir, gaps_file = folder / "rank.py", folder / "stacks", folder / "gaps.txt"
    script.write_text(RANK)
    env = hook_environment(dict(os.environ), HOOK, str(hook_dir))
    rank = subprocess.Popen(
        [sys.executable, str(script), str(gaps_file)], env=env, stdout=subprocess.DEVNULL
    )
    windows: list[tuple[float, float]] = []
    found: dict[str, list[float]] = {"call": [], "agent": [], "py-spy": [], "proc": []}
    try:
        deadline = time.monotonic() + 30
        while not (hook_dir / f"{rank.pid}.ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        way = py_spy or str(folder / "no-py-spy")  # a missing py-spy: the hook
        for _ in range(checks):
            check = dict.fromkeys(found, 0.0)
            for _sample in range(2):
                own, spy = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
                began = time.monotonic()
                (record,) = take_stacks({0: rank.pid}, str(hook_dir), way, 10.0).values()
                ended = time.monotonic()
                assert record["error"] is None, record["error"]
                check["call"] += ended - began
                check["agent"] += cpu(resource.RUSAGE_SELF) - own
                check["py-spy"] += cpu(resource.RUSAGE_CHILDREN) - spy
                windows.append((began, ended))
                read = time.perf_counter()
                main_thread_cpu(rank.pid)
                check["proc"] += time.perf_counter() - read
                time.sleep(0.5)
            for key, value in check.items():
                found[key].append(value)
    finally:
        rank.terminate()
        rank.wait(timeout=30)
    gaps = [tuple(map(float, line.split())) for line in gaps_file.read_text().splitlines()]

    def longest(began: float, ended: float) -> float:  # a gap is noted when it ends
        return max((gap for at, gap in gaps if began <= at <= ended + 0.05), default=0.0)

    stops = [longest(began, ended) for began, ended in windows]
    quiet = [longest(ended + 0.2, 2 * ended + 0.2 - began) for began, ended in windows]
    found["stop"] = [stops[i] + stops[i + 1] for i in range(0, len(stops), 2)]
    found["quiet"] = [quiet[i] + quiet[i + 1] for i in range(0, len(quiet), 2)]
    return found


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--checks", type=int, default=20, metavar="N")
    checks = args.parse_args().checks
    say(machine_line())
    rows = []
    for name, py_spy in (("py-spy", find_py_spy()), ("signal hook", None)):
        if name == "py-spy" and py_spy is None:
            say("py-spy: not found; measuring the hook alone")
            continue
        with tempfile.TemporaryDirectory(prefix="check-cost-") as folder:
            found = measure(py_spy, checks, Path(folder))
        rows.append(
            [name]
            + [
                f"{median(found[key]) * 1000:.1f} ({max(found[key]) * 1000:.1f})"
                for key in ("call", "agent", "py-spy", "stop", "quiet")
            ]
            + [f"{median(found['proc']) * 1e6:.0f} us"]
        )
    say(f"one hang check (two samples) of one rank, ms, median (most) of {checks} checks:")
    say(table(["way", "call", "agent", "py-spy", "stop", "quiet", "proc"], rows))


if __name__ == "__main__":
    main()
