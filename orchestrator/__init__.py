"""orchestrator: launch multi-node PyTorch jobs from a hostfile."""

from __future__ import annotations

__version__ = "0.1.0"
