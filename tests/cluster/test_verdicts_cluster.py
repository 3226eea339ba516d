"""True verdicts off the good day, on the namespace cluster: a node whose clock is off, a node
or a controller that stalls, a node switched off. The first failure is named by causality and
one clock, every time shown is the controller's and never negative, only a whole world
succeeds, and lost means gone, not busy. Each test ends by looking at the process table."""

from __future__ import annotations

import re
import signal
import textwrap
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.cli_helpers import assert_nothing_left, start_cli, status_of, wait_until
from tests.lab import bad_days
from tests.lab.fixtures import gate, lab_problem, under_ci
from tests.lab.packages import CLOCK_PACKAGES, SSH_PACKAGES

pytestmark = pytest.mark.cluster

# Rank FAIL_RANK exits 3 after FAIL_AFTER s (with FAIL_ONCE_MARKER: only while that file is
# absent, then it creates it); every other rank sleeps SLEEP s and exits 0. Ranks listed in
# IGNORE_TERM ignore SIGTERM (their agent must SIGKILL them after the grace).
JOB = textwrap.dedent("""
    import os, signal, sys, time
    rank = int(os.environ["RANK"])
    if str(rank) in os.environ.get("IGNORE_TERM", "").split(","):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    marker = os.environ.get("FAIL_ONCE_MARKER")
    fails = os.environ.get("FAIL_RANK") == str(rank) and not (marker and os.path.exists(marker))
    print(f"rank {rank} started", flush=True)
    seconds = float(os.environ["FAIL_AFTER"] if fails else os.environ.get("SLEEP", "120"))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.2)
    if fails:
        if marker:
            open(marker, "w").close()
        print(f"rank {rank} fails with exit code 3", flush=True)
        sys.exit(3)
    print(f"rank {rank} done", flush=True)
""")
# The stalls below: three heartbeat timeouts of STALLED_HEARTBEAT s (the agent beats three
# times a timeout, so a stall of three misses nine beats); the ranks run on ~6 s after one
# ends.
STALLED_HEARTBEAT = 3
STALL_S = 3 * STALLED_HEARTBEAT
OUTLASTS_STALL = {"SLEEP": str(STALL_S + 6)}


def stalled_heartbeat() -> tuple[str, str]:
    return ("--heartbeat-timeout", str(STALLED_HEARTBEAT))


class Console:
    """A started `orchestrator launch`, its output read line by line as it comes, timed."""

    def __init__(self, proc) -> None:
        self.proc = proc
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, timeout: float) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=timeout)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._reader.join(timeout=10)
        return self.proc.returncode, self.text

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first(self, pattern: str) -> float | None:
        """When the first line matching `pattern` arrived (monotonic), or None."""
        return next((t for t, line in self.lines if re.search(pattern, line)), None)


@pytest.fixture
def job(tmp_path: Path):
    """Write the job; return a function that launches it on a cluster (a Console)."""
    (tmp_path / "job.py").write_text(JOB)

    def start(cluster, run_id: str, *args: str, env=None) -> Console:
        hostfile = cluster.write_hostfile(tmp_path / f"hosts-{cluster.name}.txt", slots=1)
        env_args = [f"--env={name}={value}" for name, value in (env or {}).items()]
        argv = ["launch", str(hostfile), "--run-dir", str(tmp_path / "runs")]
        argv += ["--run-id", run_id, "--color", "never", *env_args, *args, "--", "job.py"]
        return Console(start_cli(argv, cwd=tmp_path, env=cluster.environ()))

    start.runs = tmp_path / "runs"
    start.tmp = tmp_path
    return start


@pytest.fixture
def faketime() -> None:
    gate(lab_problem(SSH_PACKAGES + CLOCK_PACKAGES), under_ci())


def wait_started(console: Console, job, run_id: str, rank: int, timeout: float = 120) -> None:
    """Wait for rank `rank`'s first line in the run record; fail at once if the CLI ended."""
    path = job.runs / run_id / "logs" / f"rank-{rank}.log"

    def started() -> bool:
        if console.proc.poll() is not None:
            console.wait(10)
            raise AssertionError(f"the launch ended before rank {rank} started:\n{console.text}")
        return path.exists() and f"rank {rank} started" in path.read_text(errors="replace")

    wait_until(started, timeout, f"rank {rank} to start")


def skew_name(skew: float) -> str:
    return f"{'minus' if skew < 0 else 'plus'}{abs(skew):g}"


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def assert_times_in_controller_clock(out: str, status: dict) -> None:
    """No time shown is negative; each recorded time lies within the run's own span."""
    assert "after -" not in out, out
    begun, ended = parse_time(status["started_at"]), parse_time(status["ended_at"])
    for kind in ("nodes", "ranks"):
        for entry in status[kind]:
            for field in ("started_at", "ended_at"):
                if entry.get(field):
                    when = parse_time(entry[field])
                    assert begun <= when <= ended + 1.0, (kind, entry, status["started_at"])


@pytest.mark.parametrize("skew", [-0.05, -1.0, -30.0, 30.0])
def test_first_failure_is_named_whatever_a_nodes_clock_says(
    cluster, job, faketime, skew: float
) -> None:
    run_id = f"skew-{skew_name(skew)}"
    with cluster.skew_clock(cluster.nodes[1], skew):
        console = job(cluster, run_id, "--grace", "3", env={"FAIL_RANK": "0", "FAIL_AFTER": "4"})
        code, out = console.wait(timeout=180)
    node0 = cluster.nodes[0].name
    assert code == 3, out
    assert re.search(
        rf"job failed: rank 0 \(local rank 0\) on {node0} ended with exit code 3 "
        r"after [\d.]+ s \(the first rank to fail\)",
        out,
    ), out
    status = status_of(job.runs, run_id)
    assert status["state"] == "failed" and status["exit_code"] == 3, status
    ranks = {r["rank"]: r for r in status["ranks"]}
    assert ranks[0]["state"] == "failed" and ranks[0]["exit_code"] == 3, status
    assert [ranks[r]["state"] for r in (1, 2)] == ["stopped", "stopped"], status
    assert_times_in_controller_clock(out, status)
    assert_nothing_left(run_id)


# Not +30 s: torchrun's c10d rendezvous compares its peers' keep-alive stamps (wall clock,
# every 5 s) with its own clock and counts a peer 15 s behind as dead, so a node 30 s ahead
# closes the rendezvous at the restart whatever the launcher does.
@pytest.mark.parametrize("skew", [-1.0, 5.0])
def test_restart_cause_is_named_whatever_a_nodes_clock_says(
    cluster, job, faketime, skew: float
) -> None:
    run_id = f"restart-skew-{skew_name(skew)}"
    env = {"FAIL_RANK": "0", "FAIL_AFTER": "4", "SLEEP": "10"}
    env["FAIL_ONCE_MARKER"] = str(job.tmp / f"{run_id}.failed-once")
    with cluster.skew_clock(cluster.nodes[1], skew):
        console = job(cluster, run_id, "--max-restarts", "1", env=env)
        code, out = console.wait(timeout=300)
    node0 = cluster.nodes[0].name
    assert code == 0, out
    cause = rf"restart 1: rank 0 on {node0} ended with exit code 3 after \d+\.\d s"
    assert re.search(rf"restarted 1 time\(s\) \(--max-restarts 1\):\n.*{cause}", out), out
    status = status_of(job.runs, run_id)
    assert status["state"] == "succeeded" and status["restarts"] == 1, status
    assert len(status["restart_causes"]) == 1, status
    assert re.match(cause, status["restart_causes"][0]), status
    assert_times_in_controller_clock(out, status)
    assert_nothing_left(run_id)


def test_a_node_once_lost_stays_lost_when_its_agent_reports_later(cluster, job) -> None:
    run_id = "lost-then-heard"
    victim = cluster.nodes[1]
    # The other ranks ignore SIGTERM, so the run is still being stopped (the grace) when
    # the lost node's agent is thawed and reports its ranks' ends and its script's.
    console = job(
        cluster,
        run_id,
        *("--heartbeat-timeout", "3", "--stall-timeout", "6", "--grace", "20"),
        env={"IGNORE_TERM": "0,2"},
    )
    wait_started(console, job, run_id, 1)
    agents = bad_days.agent_pids(cluster, victim, run_id)
    assert agents, cluster.processes_on(victim)
    with bad_days.frozen(agents):
        time.sleep(15)  # silent past the heartbeat and the stall timeouts
        thawed = time.monotonic()
    lost = console.first(rf"{victim.name}: lost")
    assert lost is not None and lost < thawed, console.text
    time.sleep(3)  # the thawed agent hears the stop and reports its ranks' and script's ends
    assert status_of(job.runs, run_id)["state"] != "succeeded"
    code, out = console.wait(timeout=120)
    assert code == 1, out
    assert f"job failed: node {victim.name} was lost" in out, out
    assert "succeeded" not in out, out
    status = status_of(job.runs, run_id)
    assert status["state"] == "lost" and status["exit_code"] == 1, status
    assert {n["host"]: n["state"] for n in status["nodes"]}[victim.name] == "lost", status
    assert_nothing_left(run_id)


def test_a_starved_agent_is_silent_not_lost(cluster, job) -> None:
    run_id = "agent-starved"
    victim = cluster.nodes[1]
    console = job(cluster, run_id, *stalled_heartbeat(), env=OUTLASTS_STALL)
    wait_started(console, job, run_id, 1)
    agents = bad_days.agent_pids(cluster, victim, run_id)
    assert agents, cluster.processes_on(victim)
    bad_days.stall(agents, STALL_S)  # only the agent: its sshd and its ranks run on
    code, out = console.wait(timeout=180)
    assert code == 0, out
    assert " lost" not in out, out
    silent = [line for _, line in console.lines if "silent" in line and victim.name in line]
    assert len(silent) == 1, out
    status = status_of(job.runs, run_id)
    assert status["state"] == "succeeded", status
    assert all(n["state"] == "succeeded" for n in status["nodes"]), status
    assert_nothing_left(run_id)


def test_a_node_whose_sshd_is_starved_too_is_busy_not_lost(cluster, job) -> None:
    # At 250 nodes on a machine swapping hard, a node's sshd could not answer a keepalive
    # within the heartbeat timeout and the node was counted lost; its kernel, though, still
    # acknowledged every packet. Here the node's agent and every sshd process of it stop.
    run_id = "sshd-starved"
    victim = cluster.nodes[1]
    console = job(cluster, run_id, *stalled_heartbeat(), env=OUTLASTS_STALL)
    wait_started(console, job, run_id, 1)
    agents = bad_days.agent_pids(cluster, victim, run_id)
    sshds = [
        p.pid
        for p in cluster.processes_on(victim, include_lab=True)
        if p.cmdline[0].startswith("sshd")
    ]
    assert agents and sshds, cluster.processes_on(victim, include_lab=True)
    with bad_days.frozen(agents + sshds):
        time.sleep(STALL_S)  # three heartbeat timeouts
    code, out = console.wait(timeout=180)
    assert code == 0, out
    assert " lost" not in out, out
    assert f"{victim.name}: its agent has been silent" in out, out
    assert "its kernel acknowledges every packet" in out, out
    assert status_of(job.runs, run_id)["state"] == "succeeded"
    assert_nothing_left(run_id)


def test_a_stalled_controller_loses_no_node(cluster, job) -> None:
    run_id = "controller-stalled"
    console = job(cluster, run_id, *stalled_heartbeat(), env=OUTLASTS_STALL)
    wait_started(console, job, run_id, 2)
    bad_days.stall([console.proc.pid], STALL_S)
    code, out = console.wait(timeout=180)
    assert code == 0, out
    assert " lost" not in out, out
    status = status_of(job.runs, run_id)
    assert status["state"] == "succeeded", status
    assert all(n["state"] == "succeeded" for n in status["nodes"]), status
    assert_nothing_left(run_id)


def test_a_node_switched_off_is_lost_within_the_heartbeat(make_cluster, job) -> None:
    run_id = "power-loss"
    heartbeat = 5
    with make_cluster(3) as own:
        victim = own.nodes[2]
        console = job(own, run_id, "--heartbeat-timeout", str(heartbeat), "--grace", "3")
        wait_started(console, job, run_id, 2)
        with bad_days.powered_off(own, victim):
            off = time.monotonic()
            code, out = console.wait(timeout=120)
            noticed = console.first(rf"{victim.name}: lost")
            assert_nothing_left(run_id)
    assert code == 1, out
    assert noticed is not None, out
    assert noticed - off <= heartbeat + 5, f"lost after {noticed - off:.1f} s"
    assert f"job failed: node {victim.name} was lost" in out, out
    status = status_of(job.runs, run_id)
    assert status["state"] == "lost" and status["exit_code"] == 1, status
    assert {n["host"]: n["state"] for n in status["nodes"]}[victim.name] == "lost", status
    assert_times_in_controller_clock(out, status)


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_stall_helpers_stop_and_resume(cluster) -> None:
    """The lab's freeze really stops a process of a node, and thaw lets it go on."""
    sleeper = cluster.popen_in(cluster.nodes[0], ["sleep", "30"])
    try:
        node = cluster.nodes[0]
        wait_until(lambda: sleeper.pid in bad_days.pids_but_sshd(cluster, node), 5, "the sleeper")
        with bad_days.frozen([sleeper.pid]):
            wait_until(lambda: process_state(sleeper.pid) == "T", 5, "the sleeper to stop")
        wait_until(lambda: process_state(sleeper.pid) != "T", 5, "the sleeper to go on")
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
