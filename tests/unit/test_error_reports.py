"""Errors keep their type across a detached start: the controller's report names the error's
class and what rebuilds it (errors.error_report), and `launch()`'s caller raises the same
(api/launching.started_error). Also the errors' own words: RunNotReachable, Interrupted."""

from __future__ import annotations

import json
import signal

import pytest

import orchestrator
from orchestrator.api.launching import started_error
from orchestrator.errors import (
    ConfigError,
    Interrupted,
    NodeError,
    NodeErrors,
    OrchestratorError,
    RunNotReachable,
    SourceError,
    error_report,
)

ERRORS = {
    "config": ConfigError("--nproc-per-node 0: give 1 or more"),
    "source": SourceError("hosts.txt", 3, "slots=x: not a number"),
    "node": NodeError("node7", "unknown host key; add it with ssh-keyscan", exit_code=2),
    "nodes": NodeErrors(
        [
            NodeError("node1", "jump host login: refused"),
            NodeError("node2", "jump host login: refused"),
            NodeError("node3", "no torch", exit_code=2),
        ],
        "preflight",
    ),
    "sigint": Interrupted(signal.SIGINT, "the preflight"),
    "sigterm": Interrupted(signal.SIGTERM, "the start"),
    "unreachable": RunNotReachable("run r1: its controller is gone"),
    "runtime": OrchestratorError("sbatch did not answer"),
}


def same_error(rebuilt: OrchestratorError, original: OrchestratorError) -> None:
    assert type(rebuilt) is type(original)
    assert (str(rebuilt), rebuilt.exit_code) == (str(original), original.exit_code)


@pytest.mark.parametrize("name", list(ERRORS))
def test_an_error_survives_the_report(name: str) -> None:
    original = ERRORS[name]
    report = json.loads(json.dumps(error_report(original)))  # as the pipe carries it
    rebuilt = started_error(report)
    same_error(rebuilt, original)
    if isinstance(original, NodeErrors):
        assert isinstance(rebuilt, NodeErrors)
        assert [(e.host, e.message, e.exit_code) for e in rebuilt.errors] == [
            (e.host, e.message, e.exit_code) for e in original.errors
        ]
    if isinstance(original, Interrupted):
        assert isinstance(rebuilt, orchestrator.Interrupted)
        assert rebuilt.signum == original.signum


def test_the_exit_codes_ride_along() -> None:
    assert ERRORS["nodes"].exit_code == 2 and ERRORS["node"].exit_code == 2
    assert (ERRORS["sigint"].exit_code, ERRORS["sigterm"].exit_code) == (130, 143)
    assert ERRORS["unreachable"].exit_code == 1


def test_a_report_without_a_type_is_typed_by_its_exit_code() -> None:
    assert type(started_error({"error": "bad flag", "exit_code": 2})) is ConfigError
    ended = started_error({"error": "the run ended before all nodes started", "exit_code": 3})
    assert type(ended) is OrchestratorError and ended.exit_code == 3
    unknown = started_error({"error": "x", "exit_code": 1, "error_type": "FromTheFuture"})
    assert type(unknown) is OrchestratorError and str(unknown) == "x"
