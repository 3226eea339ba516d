"""pytest plugin: the lab's fixtures, and skip-or-fail for tests marked `cluster` / `slurm`.

Enable with `pytest_plugins = ["tests.lab.fixtures"]` in tests/conftest.py.

When this machine cannot host the lab (not root, no `ip netns`, packages missing and not
installable), marked tests and the fixtures skip with the exact reason, except under
CI=true, where the same condition is an error: CI must never pass by skipping them.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

import pytest

from tests.lab import containers, leftovers, state
from tests.lab.cluster import Cluster
from tests.lab.packages import (
    PACKAGES,
    SLURM_PACKAGES,
    SSH_PACKAGES,
    LabUnavailable,
    ensure_prerequisites,
)
from tests.lab.slurm import SlurmCluster

log = logging.getLogger("tests.lab")
ALL = tuple(PACKAGES)
SESSION_NODES = 3
SLURM_NODES = 3

_verdicts: dict[tuple[str, ...], str | None] = {}
_stale_removed = False
_session_start = time.time()  # the plugin loads as the session starts


def under_ci(environ: Mapping[str, str] | None = None) -> bool:
    """True when CI=true: then a lab that cannot run is an error, never a skip."""
    return (environ if environ is not None else os.environ).get("CI", "").lower() == "true"


def lab_problem(packages: tuple[str, ...]) -> str | None:
    """Why the lab cannot run with `packages` (installing them if possible), or None. Cached.

    The first call tries to install every prerequisite (pdsh too, for the benchmarks) in one
    apt run; if that fails, a smaller set that is already complete still passes.
    """
    if packages not in _verdicts:
        if ALL not in _verdicts:
            try:
                ensure_prerequisites(ALL)
                _verdicts[ALL] = None
            except LabUnavailable as exc:
                _verdicts[ALL] = str(exc)
        if _verdicts[ALL] is None:
            _verdicts[packages] = None
        else:
            try:
                ensure_prerequisites(packages)
                _verdicts[packages] = None
            except LabUnavailable as exc:
                _verdicts[packages] = str(exc)
    return _verdicts[packages]


def gate(problem: str | None, ci: bool) -> None:
    """Skip (or, under CI, fail) the current test when `problem` says the lab cannot run."""
    if problem is None:
        return
    if ci:
        pytest.fail(f"CI=true and the lab cluster cannot run here: {problem}", pytrace=False)
    pytest.skip(f"lab cluster unavailable: {problem}")


def require_lab(slurm: bool = False) -> None:
    """Gate on the machine hosting namespace nodes (and SLURM when `slurm`)."""
    packages = SSH_PACKAGES + SLURM_PACKAGES if slurm else SSH_PACKAGES
    gate(lab_problem(packages), under_ci())


def _remove_stale_once() -> None:
    global _stale_removed
    if not _stale_removed:
        _stale_removed = True
        removed = state.remove_stale()
        if removed:
            log.info("removed stale lab clusters of dead processes: %s", ", ".join(removed))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("slurm") is not None:
        require_lab(slurm=True)
    elif item.get_closest_marker("cluster") is not None:
        require_lab()


def _teardown(cluster: Cluster) -> None:
    strays = cluster.teardown()
    if strays:
        warnings.warn(
            f"lab {cluster.name} teardown killed processes left on its nodes: {strays}",
            stacklevel=2,
        )
    # The nodes' copies of the session's runs on it, in root's real home (leftovers.py).
    removed = leftovers.remove_runs_of(cluster.name, cluster.subnet, _session_start)
    if removed:
        log.info("removed the nodes' copies of %s runs: %s", cluster.name, ", ".join(removed))


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """Three namespace nodes with sshd, shared by the whole session."""
    require_lab()
    _remove_stale_once()
    built = Cluster.create(SESSION_NODES)
    try:
        yield built
    finally:
        _teardown(built)


@pytest.fixture(scope="session")
def slurm_cluster(cluster: Cluster) -> Iterator[SlurmCluster]:
    """SLURM (munged, slurmctld, slurmds) over the session cluster's nodes, all idle."""
    require_lab(slurm=True)
    slurm = SlurmCluster.start(cluster, cluster.nodes[:SLURM_NODES])
    try:
        yield slurm
    finally:
        slurm.stop()


@pytest.fixture(scope="module")
def container_cluster() -> Iterator[tuple[Cluster, str]]:
    """Three namespace nodes that can run podman containers, and the lab's image (built
    once per environment, containers.py), for one test module."""
    require_lab()
    _remove_stale_once()
    try:
        image = containers.ensure_image()
    except LabUnavailable as exc:
        gate(str(exc), under_ci())
        raise
    built = Cluster.create(SESSION_NODES, containers=True)
    try:
        yield built, image
    finally:
        _teardown(built)


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., AbstractContextManager[Cluster]]]:
    """A factory: `with make_cluster(n) as c:` builds an extra cluster of n nodes.

    Clusters still up when the test ends are torn down then.
    """
    require_lab()
    _remove_stale_once()
    live: list[Cluster] = []

    @contextmanager
    def factory(n: int, **kwargs: object) -> Iterator[Cluster]:
        built = Cluster.create(n, **kwargs)  # type: ignore[arg-type]
        live.append(built)
        try:
            yield built
        finally:
            live.remove(built)
            _teardown(built)

    yield factory
    for leftover in live:
        _teardown(leftover)
