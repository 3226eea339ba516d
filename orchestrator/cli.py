from __future__ import annotations

import click


@click.group()
def main() -> None:
    """Launch multi-node PyTorch jobs."""
