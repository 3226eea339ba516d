"""Supervision of a started run: failure detection (`detect`) and stopping (`stopping`),
driven by the one loop in `run_loop` through `supervisor`; `state` holds what they share.

clocks.py          node times in the controller's clock: each node's offset, measured, never assumed
detect.py          failure detection: the reports as they come, who failed first
flight_report.py   torch's flight recorder, collected
frame_handlers.py  what the supervisor does with each kind of frame a node's agent sends
hangs.py           hangs
liveness.py        lost means gone, not busy
metrics.py         the metrics channel on the controller
restarts.py        restarts under torchrun's --max-restarts, as the run record counts and names them
run_loop.py        the one supervision loop, for every backend: a pass, and what a backend adds
stack_groups.py    many ranks' stacks read like a folded console
stack_names.py     where a thread is, named as a user would look for it
stack_rounds.py    taking every rank's stacks through the node agents
state.py           what supervision knows about each node and rank, and how a run ended
status_pace.py     how often status.json is told of changes: at most a tenth of the time
stopping.py        stopping a run
stragglers.py      stragglers: the rank that holds every other back, named while the run goes on
straggler_swap.py  a node slow for --swap-stragglers-after, taken out at a checkpoint
summaries.py       the run's end, read from what detect.py kept: faults, facts, outcome, words
supervisor.py      supervision
time_limit.py      the time limit of an SSH or local run and the warning signal ahead of it
unreachable.py     A node whose processes get no answer from the store or a peer
verdict.py         how a run ended, as one table: from what was recorded to a state and an exit code
"""

from __future__ import annotations

from orchestrator.supervise.state import NodeState, Outcome, RankState, describe_exit
from orchestrator.supervise.stopping import signals_to
from orchestrator.supervise.supervisor import Supervisor

__all__ = ["NodeState", "Outcome", "RankState", "Supervisor", "describe_exit", "signals_to"]
