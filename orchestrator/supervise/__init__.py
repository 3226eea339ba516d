"""Supervision of a started run: failure detection (`detect`) and stopping (`stopping`),
driven by the event loop in `supervisor`; `state` holds what they share."""

from __future__ import annotations

from orchestrator.supervise.state import NodeState, Outcome, RankState, describe_exit
from orchestrator.supervise.stopping import signals_to
from orchestrator.supervise.supervisor import Supervisor

__all__ = ["NodeState", "Outcome", "RankState", "Supervisor", "describe_exit", "signals_to"]
