"""The SLURM backend: sbatch / squeue / scontrol / sacct / scancel, here or on a login node.

`SlurmCommands` runs SLURM's client commands on this machine, or with `login` on a login
node over SSH (orchestrator.backends.ssh). What SLURM prints is read by the small `parse_*`
functions of orchestrator.slurm.control.parse (tested on captured outputs); everything here works on
their results.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from orchestrator.backends.scheduler_states import SchedulerState
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.record.runs import RunRecord, controller_alive, now_iso, run_status
from orchestrator.record.states import RunState
from orchestrator.slurm.control.parse import (
    JobInfo,
    parse_job_id,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue,
)

COMMAND_TIMEOUT_S = 120.0
UNREACHABLE_GRACE_S = 120.0  # how long squeue may fail before the launcher gives up
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|"
    r"Connection refused|Zero Bytes were transmitted",
    re.IGNORECASE,
)


# --- running the commands ----------------------------------------------------------------


class SlurmCommands:
    """SLURM's client commands, run here or (login) on a login node over SSH."""

    def __init__(self, login: str | None = None, ssh_options: object | None = None) -> None:
        self.login = login
        self.where = f"on {login}" if login else "on this machine"
        self._connection = None
        self.ssh_options = ssh_options
        self._more: list = []  # further connections, for streams past sshd's MaxSessions
        if login:
            self._connection = self._connect()

    def _connect(self):  # noqa: ANN202 - an SshConnection, whose module loads paramiko
        from orchestrator.backends.ssh import SshSession
        from orchestrator.hosts.hostfile import Host

        session = SshSession(self.ssh_options)  # type: ignore[arg-type]
        connection = session.connect(Host(name=self.login))
        session.report()
        return connection

    def run(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        timeout: float = COMMAND_TIMEOUT_S,
        stdin: bytes | None = None,
    ) -> tuple[int, str, str]:
        """(exit status, stdout, stderr); a missing command is a ConfigError. `env` is
        added to the command's environment (over SSH: sent on stdin, never in argv);
        `stdin`: the command's standard input (else none)."""
        if self._connection is None:
            try:
                done = subprocess.run(
                    argv,
                    input=stdin,
                    stdin=None if stdin is not None else subprocess.DEVNULL,
                    capture_output=True,
                    timeout=timeout,
                    env={**os.environ, **(env or {})},
                )
            except FileNotFoundError:
                raise self._missing(argv[0]) from None
            except subprocess.TimeoutExpired:
                raise OrchestratorError(
                    f"{argv[0]} did not answer within {timeout:g} s "
                    f"{self.where}; is the SLURM controller up?"
                ) from None
            rc, out, err = done.returncode, done.stdout, done.stderr
        else:
            rc, out, err = self._run_remote(argv, env or {}, timeout, stdin)
            if rc == 127 and not out:
                raise self._missing(argv[0])
        return rc, out.decode(errors="replace"), err.decode(errors="replace")

    def _run_remote(
        self, argv: list[str], env: dict[str, str], timeout: float, data: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        import paramiko

        # This shell's SLURM_CONF (a non-default cluster config) applies there too. Values
        # travel on stdin, never on a command line other users can see.
        settings = {
            **({"SLURM_CONF": os.environ["SLURM_CONF"]} if "SLURM_CONF" in os.environ else {}),
            **env,
        }
        command, stdin = remote_command(argv, settings, data)
        try:
            channel = self._connection.client.get_transport().open_session(timeout=timeout)
            channel.settimeout(timeout)
            channel.exec_command(command)
            channel.sendall(stdin)
            channel.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            while True:  # both streams, so that neither fills up while the other is read
                if channel.recv_ready():
                    out += channel.recv(65536)
                elif channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                elif channel.exit_status_ready():  # sent after all output
                    break
                elif time.monotonic() > deadline:
                    raise OSError(f"no answer within {timeout:g} s")
                else:
                    time.sleep(0.005)
            rc = channel.recv_exit_status()
            channel.close()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise OrchestratorError(f"running {argv[0]} on {self.login} failed: {exc}") from None
        return rc, bytes(out), bytes(err)

    def open_stream(self, argv: list[str]) -> Any:
        """A long-lived command on the login node whose stdin and stdout are the channel
        returned (a paramiko Channel): the node agents' dials (--login). This shell's
        SLURM_CONF goes with it (a path, not a secret)."""
        import paramiko

        conf = os.environ.get("SLURM_CONF")
        command = (f"SLURM_CONF={shlex.quote(conf)} " if conf else "") + shlex.join(argv)
        try:
            for connection in [self._connection, *self._more]:
                try:
                    channel = connection.client.get_transport().open_session(
                        timeout=COMMAND_TIMEOUT_S
                    )
                    break
                except paramiko.ChannelException:  # it has all the sessions sshd allows
                    continue
            else:  # sshd allows MaxSessions (10 by default) per connection: one more
                self._more.append(self._connect())
                channel = (
                    self._more[-1].client.get_transport().open_session(timeout=COMMAND_TIMEOUT_S)
                )
            channel.exec_command(command)
        except (OSError, EOFError, paramiko.SSHException, OrchestratorError) as exc:
            raise OrchestratorError(f"running {argv[0]} on {self.login} failed: {exc}") from None
        return channel

    def _missing(self, name: str) -> ConfigError:
        if self.login:
            return ConfigError(
                f"{name}: command not found on {self.login}; is it a login node "
                "of a SLURM cluster (with sbatch, squeue and scancel on PATH)?"
            )
        return ConfigError(
            f"{name}: command not found: SLURM's client commands (sbatch, squeue, "
            "scancel) are not installed here or not on PATH; run from a login "
            "node of the cluster, or pass --login HOST to submit there over SSH"
        )

    def check(self, argv: list[str]) -> str:
        """Run a query; an unreachable controller or another failure is an error."""
        rc, out, err = self.run(argv)
        if rc != 0:
            raise unreachable_or(err, argv, self.where)
        return out

    def close(self) -> None:
        for connection in self._more:
            connection.close()
        self._more = []
        if self._connection is not None:
            self._connection.close()
            self._connection = None


# Reads NAME=BASE64 lines from stdin up to an empty one into the environment, leaving the
# rest of stdin (read a byte at a time by `read`) to the command.
# (The x kept after the value keeps its trailing newlines from $(...).)
_EXPORT_LINES = (
    'while IFS= read -r line && [ -n "$line" ]; do '
    'value=$(printf %s "${line#*=}" | base64 -d && echo x) || exit 1; '
    'export "${line%%=*}=${value%x}"; done; unset line value'
)


def remote_command(
    argv: list[str], settings: dict[str, str], data: bytes | None
) -> tuple[str, bytes]:
    """The shell command a login node runs for `argv`, and what it is sent on stdin:
    `settings` sourced into its environment (never on its command line), then `data` as
    the command's own stdin, if any."""
    command = shlex.join(argv)
    if data is not None:  # the settings, then the command's own input, on one stdin
        lines = "".join(
            f"{k}={base64.b64encode(v.encode()).decode()}\n" for k, v in settings.items()
        )
        return f"{_EXPORT_LINES} && exec {command}", (lines + "\n").encode() + data
    if not settings:
        return command, b""
    stdin = "".join(f"{k}={shlex.quote(v)}\n" for k, v in settings.items()).encode()
    return f"set -a && . /dev/stdin && set +a && exec {command}", stdin


def unreachable_or(stderr: str, argv: list[str], where: str) -> OrchestratorError:
    text = stderr.strip() or "(no message)"
    if _UNREACHABLE.search(text):
        return OrchestratorError(
            f"cannot reach the SLURM controller {where} ({argv[0]}: "
            f"{text}); is slurmctld up, and does SLURM_CONF (or "
            "/etc/slurm/slurm.conf) point at it? `sinfo` shows the same"
        )
    return OrchestratorError(f"{shlex.join(argv)} failed {where}: {text}")


# --- the operations ----------------------------------------------------------------------


def submit(
    commands: SlurmCommands, script_path: str, secrets: dict[str, str], on_stdin: bool = False
) -> int:
    """sbatch the script; its job id. sbatch's refusal is a ConfigError naming the script.
    `on_stdin`: the script goes to sbatch on its stdin (`sbatch --parsable < job.sbatch`),
    for a login node that does not see the run record."""
    if on_stdin:
        script = Path(script_path).read_bytes()
        rc, out, err = commands.run(["sbatch", "--parsable"], env=secrets, stdin=script)
    else:
        rc, out, err = commands.run(["sbatch", "--parsable", script_path], env=secrets)
    if rc != 0:
        message = err.strip() or out.strip() or f"exit status {rc}"
        if _UNREACHABLE.search(message):
            raise unreachable_or(message, ["sbatch"], commands.where)
        raise ConfigError(f"sbatch rejected {script_path}:\n  " + "\n  ".join(message.splitlines()))
    return parse_job_id(out)


def query(commands: SlurmCommands, job_id: int) -> JobInfo:
    """The job's state: squeue while it is queued or running, then scontrol, then sacct."""
    rc, out, err = commands.run(["squeue", "-h", "-j", str(job_id), "-o", "%T|%r|%N"])
    if rc == 0:
        info = parse_squeue(out)
        if info is not None and not info.ended:
            return info
    elif "Invalid job id" not in err:
        raise unreachable_or(err, ["squeue"], commands.where)
    return job_details(commands, job_id)


def job_details(commands: SlurmCommands, job_id: int) -> JobInfo:
    """scontrol's record of the job (exit code, restarts), or sacct's once it is purged."""
    rc, out, _ = commands.run(["scontrol", "-o", "show", "job", str(job_id)])
    info = parse_scontrol_job(out) if rc == 0 else None
    if info is not None:
        return info
    rc, out, _ = commands.run(
        ["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "State,ExitCode,NodeList"]
    )
    info = parse_sacct(out) if rc == 0 else None
    return info or JobInfo(
        state="UNKNOWN", reason="no longer known to squeue, scontrol or sacct", source="none"
    )


def expand_nodelist(commands: SlurmCommands, nodelist: str) -> list[str]:
    """node[1-3],x -> [node1, node2, node3, x], as SLURM numbers SLURM_NODEID."""
    if not nodelist:
        return []
    return commands.check(["scontrol", "show", "hostnames", nodelist]).split()


def hosts_of(commands: SlurmCommands, nodelist: str, count: int) -> list[str]:
    """The `count` host names of `nodelist`; node0 to node<count-1> where SLURM does not
    give that many."""
    try:
        hosts = expand_nodelist(commands, nodelist)
    except OrchestratorError:
        hosts = []
    return hosts if len(hosts) == count else [f"node{k}" for k in range(count)]


class Squeue:
    """squeue for a followed job that rides out SLURM's controller restarting: while
    squeue fails, the last answer stands, for up to UNREACHABLE_GRACE_S."""

    def __init__(self, commands: SlurmCommands) -> None:
        self.commands = commands
        self.failing_since: float | None = None  # monotonic

    def query(self, job_id: int, last: JobInfo, now: float) -> JobInfo:
        """What squeue says of `job_id` now (monotonic `now`), else `last`."""
        try:
            info = query(self.commands, job_id)
        except ConfigError:
            raise
        except OrchestratorError as exc:  # e.g. the controller restarting: retry
            self.failing_since = self.failing_since or now
            if now - self.failing_since > UNREACHABLE_GRACE_S:
                raise OrchestratorError(
                    f"{exc}; SLURM job {job_id} may still run: `orchestrator status` asks again"
                ) from None
            return last
        self.failing_since = None
        return info


def cancel(commands: SlurmCommands, job_id: int, kill: bool = False) -> None:
    """scancel the job (SIGTERM, then SIGKILL after SLURM's KillWait); `kill`: SIGKILL now."""
    if kill:
        commands.run(["scancel", "--signal=KILL", "--full", str(job_id)])
    rc, _, err = commands.run(["scancel", str(job_id)])
    if rc != 0 and "already completing or completed" not in err and "Invalid job id" not in err:
        raise unreachable_or(err, ["scancel"], commands.where)


def wait_gone(commands: SlurmCommands, job_id: int, timeout: float) -> JobInfo | None:
    """Wait until squeue no longer lists the job (every process ended); its final info."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = query(commands, job_id)
        if info.ended:
            return info
        time.sleep(0.3)
    return None


# --- acting on a recorded run (stop, status) ---------------------------------------------


def cancel_run(record: RunRecord, status: dict, say=print, wait_s: float = 120.0) -> int:
    """`orchestrator stop RUN` for a SLURM run: scancel its job and wait until it is gone."""
    job_id = status.get("slurm_job_id")
    if job_id is None:
        say(f"run {record.run_id}: no SLURM job was submitted")
        return 1
    commands = SlurmCommands(status.get("slurm_login"))
    try:
        cancel(commands, int(job_id))
        say(f"run {record.run_id}: cancelled SLURM job {job_id} (scancel)")
        info = wait_gone(commands, int(job_id), wait_s)
    finally:
        commands.close()
    if info is None:
        say(f"run {record.run_id}: SLURM job {job_id} still listed by squeue after {wait_s:g} s")
        return 1
    deadline = time.monotonic() + 15
    current = run_status(status)
    while current.being_written and time.monotonic() < deadline:
        time.sleep(0.2)  # the launcher following it records the end
        current = record.run_status()
    if not current.ended_in_record:
        record.write_status(final_status(dict(current.document), info))
    say(
        f"run {record.run_id}: {record.read_status().get('state')} (SLURM job {job_id} "
        f"{info.state})"
    )
    return 0


def final_status(status: dict, info: JobInfo) -> dict:
    """The status of a run whose job ended while nobody followed it."""
    state = {
        SchedulerState.SUCCEEDED: RunState.SUCCEEDED,
        SchedulerState.CANCELLED: RunState.STOPPED,
    }.get(info.scheduler_state, RunState.FAILED)
    code = 0 if state == RunState.SUCCEEDED else (info.exit_code or 1)
    return {
        **status,
        "state": state,
        "slurm_state": info.state,
        "exit_code": code,
        "ended_at": status.get("ended_at") or now_iso(),
        "summary": status.get("summary")
        or (
            None
            if state == RunState.SUCCEEDED
            else f"SLURM job {status.get('slurm_job_id')} ended {info.state}"
        ),
    }


def refresh_status(record: RunRecord, status: dict) -> dict:
    """For `status RUN`: SLURM's word on an unfinished run; recorded once its job ended
    and no launcher follows it any more."""
    job_id = status.get("slurm_job_id")
    if job_id is None or run_status(status).ended_in_record:
        return status
    commands = SlurmCommands(status.get("slurm_login"))
    try:
        info = query(commands, int(job_id))
    finally:
        commands.close()
    status = {
        **status,
        "slurm_state": info.state
        + (f" ({info.reason})" if info.reason and info.reason != "None" else ""),
    }
    if info.ended and not controller_alive(status):
        status = final_status(status, info)
        record.write_status(status)
    return status
