"""Entry point for ``python -m orchestrator.trainer``."""

from __future__ import annotations

import sys

from orchestrator.trainer.cli import main

sys.exit(main())
