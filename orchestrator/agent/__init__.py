"""The node agent (see orchestrator.agent.main); what the controller uses of it."""

from __future__ import annotations

from orchestrator.agent.main import (
    BOOTSTRAP,
    IDLE_S,
    RankFile,
    agent_argv,
    encode_config,
    frame,
    length_prefixed,
)

__all__ = ["BOOTSTRAP", "IDLE_S", "RankFile", "agent_argv", "encode_config", "frame",
           "length_prefixed"]
