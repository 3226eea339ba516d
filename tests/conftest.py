from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest_plugins = ["tests.lab.fixtures"]

TESTS = Path(__file__).resolve().parent
# A test's tier is the folder it lives in, and the folder is its marker: `-m unit`,
# `-m "not cluster"`. Explicit markers stay (the SLURM files are `slurm` too).
TIERS = ("unit", "local", "cluster")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: it must see the tier markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _mark_the_tier_of_each_folder(items)
    _skip_openssh_without_its_tools(items)
    _skip_cuda_without_a_gpu(items)


def _mark_the_tier_of_each_folder(items: list[pytest.Item]) -> None:
    """tests/unit/... is marked `unit`, tests/local/... `local`, tests/cluster/... `cluster`
    (which the lab's plugin gates: skipped where the lab cannot run, an error under CI=true)."""
    for item in items:
        path = Path(item.path).resolve()
        for tier in TIERS:
            if path.is_relative_to(TESTS / tier):
                item.add_marker(tier)


def _skip_openssh_without_its_tools(items: list[pytest.Item]) -> None:
    """Skip tests marked `openssh` where ssh-keygen is missing; under CI=true they fail."""
    from tests.lab.fixtures import under_ci  # the plugin above: imported once it is loaded

    if shutil.which("ssh-keygen") is not None or under_ci():
        return
    reason = "needs OpenSSH's client tools (ssh-keygen, ssh-agent): apt install openssh-client"
    for item in items:
        if item.get_closest_marker("openssh") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def _skip_cuda_without_a_gpu(items: list[pytest.Item]) -> None:
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
