"""The preflight's time limit: how long it is, and that a node it cut short is named with
that cause (not as 'stopped', which means another node failed)."""

from __future__ import annotations

import pytest

from orchestrator.errors import NodeErrors
from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.nodes import probe
from orchestrator.nodes.execute import NodeResult
from orchestrator.plan.spec import JobSpec, Program


class Reached:
    def __init__(self, host: str) -> None:
        self.host, self.address = host, f"10.0.0.{host[-1]}"


def test_the_limit_grows_with_the_nodes_only_past_a_minute() -> None:
    assert probe.probe_time_limit(1) == probe.probe_time_limit(120) == 60.0
    assert probe.probe_time_limit(250) == 125.0


def test_a_probe_cut_by_the_time_limit_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = parse_hostfile("n1\nn2\n", "hosts.txt")
    spec = JobSpec(
        program=Program.from_argv(["train.py"]), python="/usr/bin/python3", workdir="/work"
    )

    def cut(connections, pythons, argvs, **kwargs):
        assert kwargs["time_limit"] == 60.0
        return [NodeResult(c.host, None, "", "stopped", "time limit reached") for c in connections]

    monkeypatch.setattr(probe, "run_on_nodes", cut)
    with pytest.raises(NodeErrors) as raised:
        probe.probe_nodes(cluster, spec, [Reached("n1"), Reached("n2")])
    assert str(raised.value).splitlines() == [
        "preflight failed on 2 node(s):",
        "  n[1-2] (2 nodes): preflight probe did not finish within 60 s (the node, or this "
        "machine, too busy; or the probe hangs there: try `orchestrator check`, or skip the "
        "probe with --no-preflight)",
    ]
