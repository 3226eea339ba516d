from __future__ import annotations

import pytest

pytest_plugins = ["tests.lab.fixtures"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip tests marked `cuda` where torch sees no GPU (torch imported only if needed)."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    built = torch.version.cuda
    reason = (
        "needs CUDA: torch.cuda.is_available() is False ("
        + (
            f"torch built for CUDA {built}, but no GPU is visible"
            if built
            else "a CPU-only torch build"
        )
        + ")"
    )
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=reason))
