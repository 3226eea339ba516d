"""The supervision group: how a started run's failures, silences and stops are timed and
judged (launch; supervise/ uses it, and `exec` with its own grace)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.agent.protocol import GRACE_S, HEARTBEAT_TIMEOUT_S, STALL_S
from orchestrator.options.declare import OptionGroup, option

# A rank is a straggler when its own step work, averaged over WINDOW_S, stays above RATIO
# times the other ranks' median (supervise/stragglers.py).
STRAGGLER_RATIO = 1.5
STRAGGLER_WINDOW_S = 20.0
# --spares / --min-nodes: a node whose rank stays a straggler on both signals this long is
# taken out at a checkpoint (supervise/straggler_swap.py).
SWAP_AFTER_S = 300.0
# --min-nodes: how often a run asks the nodes it lost whether they are back, at most.
ASK_AGAIN_S = 30.0


def straggler_rule(value: str | tuple[float, float]) -> tuple[float, float]:
    """--stragglers RATIO,SECONDS (or the pair itself): a ratio above 1, a positive window."""
    if isinstance(value, str):
        ratio, _, seconds = value.partition(",")
        try:
            value = (float(ratio), float(seconds))
        except ValueError:
            value = (0.0, 0.0)
    if not (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        and value[0] > 1
        and value[1] > 0
    ):
        raise ValueError(
            "give RATIO,SECONDS, a ratio above 1 and a positive window "
            f"(e.g. {STRAGGLER_RATIO:g},{STRAGGLER_WINDOW_S:g})"
        )
    return float(value[0]), float(value[1])


@dataclass(frozen=True)
class Supervision(OptionGroup):
    """How a started run is watched, judged and stopped."""

    grace: float = option(
        GRACE_S,
        "On a failure or Ctrl-C, how long ranks get between SIGTERM and SIGKILL.",
        metavar="SECONDS",
        kind=float,
        minimum=0,
    )
    heartbeat_timeout: float = option(
        HEARTBEAT_TIMEOUT_S,
        "A node whose agent is silent this long and whose sshd does not answer an SSH "
        "keepalive either is lost (the run stops); a node that hears nothing from the "
        "orchestrator this long, and whose connection's other end does not answer, stops its "
        "part by itself. 0: never.",
        metavar="SECONDS",
        kind=float,
        minimum=0,
    )
    stall_timeout: float = option(
        STALL_S,
        "A node whose agent is silent but whose sshd still answers is busy, not lost: it is "
        "waited for this long before it counts as lost (and an agent waits as long for a "
        "silent orchestrator whose host still answers).",
        metavar="SECONDS",
        kind=float,
        minimum=0,
    )
    hang_timeout: float = option(
        300.0,
        "When no rank has made progress this long (a new step on the metrics channel, or a "
        "main thread that moved; printed lines only put a check off, by 5 s at most), every "
        "rank's stack is taken twice, 5 s apart: if no main thread moved, the run hangs: the "
        "console names the odd ranks out and where they wait, the stacks go to "
        "runs/RUN/stacks/ and torch's flight recorder dumps to runs/RUN/flight/ (its "
        "analyser names the collective the stuck ranks never joined), and the run ends "
        "`hung` (exit 1) before anything is killed, or, while --max-restarts has restarts "
        "left, the stuck ranks are ended so that torchrun restarts the workers. If any "
        "moved, it works and goes on. 0: never check.",
        metavar="SECONDS",
        kind=float,
        minimum=0,
    )  # 0: no hang checks (supervise/hangs.py)
    stragglers: tuple[float, float] = option(
        f"{STRAGGLER_RATIO:g},{STRAGGLER_WINDOW_S:g}",  # as the flag takes it; a pair once read
        "Name a rank a straggler (once, on the console and in status.json) when its own step "
        "work, averaged over SECONDS, stays above RATIO times the other ranks' median. Its "
        "own work is what ranks report as work_s on the metrics channel (the bundled trainer "
        "does): step time alone names nobody, since every rank waits for the slowest.",
        metavar="RATIO,SECONDS",
        parse=straggler_rule,
    )
    swap_stragglers: bool = option(
        True,
        "Never take a slow node out (see --swap-stragglers-after).",
        name="--no-swap-stragglers",
        switch="off",
    )
    swap_stragglers_after: float = option(
        SWAP_AFTER_S,
        "With --spares or --min-nodes: a node whose rank stays the straggler this long on "
        "both signals (its own step work above RATIO times the other ranks' median, and the "
        "run's step above RATIO times that median too: the run waits for it; both averaged "
        "over --stragglers' window) is taken out at a checkpoint asked for then, as a node "
        "fault is: a spare takes its place, or the run goes on with the nodes left at the "
        "same global batch; never below --min-nodes. It goes on the bad-node list, saying "
        "why, and is not asked back in this run. The ranks are asked to checkpoint with the "
        "warning signal (--signal; the bundled trainer saves and ends on it).",
        metavar="SECONDS",
        kind=float,
        above=0,
    )

    @property
    def ask_again_every(self) -> float:
        """--min-nodes: how often the hosts a run does not run on are asked whether they
        are back (over SSH and under SLURM alike): every 30 s, or twice the heartbeat
        timeout if less."""
        timeout = self.heartbeat_timeout
        return min(ASK_AGAIN_S, 2 * timeout) if timeout > 0 else ASK_AGAIN_S


# Work on the nodes that is not a job (exec's command, probes, cleaning): its processes get
# less time between SIGTERM and SIGKILL than a job's ranks, and no hang checks (no ranks).
TASK_GRACE_S = 5.0
NODE_TASKS = Supervision(grace=TASK_GRACE_S, hang_timeout=0)
