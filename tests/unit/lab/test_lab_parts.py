"""The lab's parts that need no cluster: the CI rule (skip, or fail under CI=true), the
address plan of a cluster's subnet, and the inotify limit a large cluster raises. The lab's
self-tests on real namespace nodes are in tests/cluster/test_lab.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab import limits, netns, state
from tests.lab.fixtures import gate, under_ci


def test_missing_lab_skips_outside_ci_and_fails_under_ci() -> None:
    gate(None, ci=True)  # nothing missing: no effect
    with pytest.raises(pytest.skip.Exception, match="not running as root"):
        gate("not running as root", ci=False)
    with pytest.raises(pytest.fail.Exception, match="CI=true.*not running as root"):
        gate("not running as root", ci=True)
    assert under_ci({"CI": "true"}) and not under_ci({"CI": "false"}) and not under_ci({})


def test_a_cluster_subnet_holds_its_bridge_and_every_node_of_the_largest_cluster() -> None:
    # 256 nodes and a jump host (the scale benchmarks) need more than a /24.
    assert netns.MAX_NODES >= 257
    for index in (0, 1, state.MAX_CLUSTERS - 1):
        net = state.subnet_of(index)
        record = state.ClusterState(f"olab{index}", index, 0, 0, "br")
        bridge = netns.bridge_address(record)
        nodes = [netns.node_address(net, i) for i in range(netns.MAX_NODES)]
        everything = [bridge, *nodes]
        assert len(set(everything)) == len(everything)
        usable = {str(a) for a in net.hosts()}
        assert set(everything) <= usable, set(everything) - usable
    assert not state.subnet_of(0).overlaps(state.subnet_of(1))


def test_a_cluster_past_the_inotify_limit_raises_it_and_restore_puts_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One inotify instance per node agent (tests/lab/limits.py), on a stand-in file."""
    setting = tmp_path / "max_user_instances"
    setting.write_text("128\n")
    monkeypatch.setattr(limits, "INOTIFY_INSTANCES", setting)
    assert limits.raise_for(32) is None  # 2 * 32 + 64 <= 128: left alone
    assert setting.read_text() == "128\n"
    assert limits.raise_for(256) == 128  # what it found, for the teardown
    assert limits.current() == limits.needed(256) >= 2 * 256
    assert limits.raise_for(100) is None  # high enough already: never lowered
    limits.restore(128)
    assert limits.current() == 128
