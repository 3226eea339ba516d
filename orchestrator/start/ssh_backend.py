"""The ssh and local backends: every node's agent started over SSH (or as a subprocess for
this machine's entries) and supervised from the controller (start/launcher.py); local is
ssh with every host this machine."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import BinaryIO

from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.options.backend_facts import LOCAL, SSH
from orchestrator.plan.scripts import write_rendered
from orchestrator.record.runs import RunRecord
from orchestrator.record.states import RunStatus
from orchestrator.start import launcher
from orchestrator.start.launch_backend import Backend, Say
from orchestrator.start.preflight import check_script_exists, prepare
from orchestrator.start.settings import LaunchRequest


class SshBackend(Backend):
    """Over SSH: the controller starts each node's agent and is the run's only follower."""

    facts = SSH

    def render(self, request: LaunchRequest, out_dir: str) -> list[Path]:
        assert request.cluster is not None
        options = request.options
        if options.deadline.limit_s is not None:
            raise ConfigError(
                "--time over SSH is kept by launch's controller: the node scripts run by hand "
                "have no time limit and no warning signal; leave --time (and --signal) out of "
                "render, or render --backend slurm"
            )
        check_script_exists(request.cluster, request.spec)  # as launch does, on this machine
        plan, scripts = prepare(request.cluster, request.spec, options, connections=None)
        return write_rendered(out_dir, plan, scripts)

    def launch(self, request: LaunchRequest, *, dry_run: bool, out: BinaryIO) -> int:
        assert request.cluster is not None
        return launcher.launch(
            request.cluster, request.spec, request.options, dry_run=dry_run, out=out
        )

    def start_detached(self, request: LaunchRequest) -> dict:
        assert request.cluster is not None
        return launcher.start_detached(request.cluster, request.spec, request.options)

    def poll(self, record: RunRecord, current: RunStatus) -> RunStatus:
        # The controller writes the record as its nodes go; a gone one reads as lost
        # (record/states.py): nothing else knows more.
        return current

    def stop(self, record: RunRecord, current: RunStatus, wait_s: float, say: Say) -> int:
        """SIGTERM to the run's controller, which stops every node in order (as Ctrl-C
        does), then up to `wait_s` for the end."""
        status = dict(current.document)
        if not current.controller_alive:  # lost: said as what it means here
            say(
                f"run {record.run_id}: its controller (pid {status['controller']['pid']}) is "
                "gone; its nodes stop their part by themselves once they lose contact with it"
            )
            return 1
        pid = status["controller"]["pid"]
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            raise OrchestratorError(f"run {record.run_id}: controller pid {pid} vanished") from None
        say(f"run {record.run_id}: asked controller (pid {pid}) to stop it on every node")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            current = record.run_status()
            if current.ended_in_record:
                say(f"run {record.run_id}: {current.recorded_state}")
                return 0
            if not current.controller_alive:
                say(f"run {record.run_id}: controller ended")
                return 0
            time.sleep(0.2)
        say(
            f"run {record.run_id}: still stopping after {wait_s:g} s; run `orchestrator stop "
            f"{record.run_id}` again to kill it at once"
        )
        return 1


class LocalBackend(SshBackend):
    """Every host this machine (api/request.py refuses another): each node a subprocess."""

    facts = LOCAL
