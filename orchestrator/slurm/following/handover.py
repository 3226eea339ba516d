"""What a SLURM run's controller leaves in the run record so that another can take over.

The job belongs to SLURM: a controller that dies (its login node rebooted, a kill -9) does
not end it, and `orchestrator attach RUN` starts a new one that follows the job on
(orchestrator.slurm.attach). For that the follower keeps two files in the record:

- `follower.json`, rewritten whenever the run's status is: the job as planned (its
  `SlurmJob`), the job now followed, the status written so far, how the run is watched and
  shown (--grace, --hang-timeout, --fold...), how SLURM is reached (--login and its SSH
  options), and the attempts and spares so far. Never a secret's value: a new controller
  takes those from its own environment, by name, as a launch does.
- `follower-points.json`, rewritten after every pass that wrote lines: how far each source
  had been read (the nodes' files, the batch script's output, each node agent's stream) and
  how long each log file then was. One consistent snapshot: a new controller cuts the logs
  back to those lengths and reads every source on from there, so that no line is lost and
  none is written twice, however the old one died.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orchestrator.agent.ranks import RankFile
from orchestrator.console.sink import LogSink
from orchestrator.errors import ConfigError
from orchestrator.options.reaching import SshOptions
from orchestrator.options.supervision import Supervision
from orchestrator.record.older_names import saved
from orchestrator.record.plain import from_plain, to_plain
from orchestrator.record.recoveries import Recovery
from orchestrator.record.runs import RunRecord
from orchestrator.slurm.batch.job import SlurmJob
from orchestrator.slurm.following.stream import AttemptFiles
from orchestrator.slurm.recovery.job_attempts import JobAttempt, JobAttempts
from orchestrator.slurm.recovery.spares import SlurmSpares
from orchestrator.supervise import Supervisor

NODE_FIELDS = ("state", "exit_code", "pid", "started_at", "ended_at", "detail", "done")
RANK_FIELDS = ("state", "exit_code", "ended_at", "error_file")
STATE_FILE = "follower.json"
POINTS_FILE = "follower-points.json"
LOCK_FILE = "follower.lock"  # held by the controller that follows the run
VERSION = 1


@dataclass(frozen=True)
class Following:
    """How a run is followed, decided at its launch: what a new controller keeps."""

    command: str  # the launch's command line (secrets masked), for resubmitted scripts
    login: str | None  # --login: SLURM's commands run there
    ssh: SshOptions | None  # how --login is reached
    supervision: Supervision
    fold: bool
    footer: bool
    bad_nodes: str | None  # --bad-nodes: where a failed node is written out (--spares)


@dataclass
class Points:
    """Where each source was read to, and how long each log then was (the module
    docstring): the `job_id` and `attempt` they belong to, byte offsets of the batch
    script's output, of the attempt's files (by their path under the attempt's folder) and
    of each node agent's stream, log file name -> size, and the nodes' and ranks' states
    then."""

    job_id: int = 0
    attempt: int = -1
    batch: int = 0
    files: dict[str, int] | None = None
    agents: dict[str, int] | None = None
    logs: dict[str, int] | None = None
    # What those sources had told of the nodes and ranks (their states, exits, times):
    # node or rank -> NODE_FIELDS / RANK_FIELDS, for what is not read again.
    nodes: dict[str, dict] | None = None
    ranks: dict[str, dict] | None = None

    def of(self, job_id: int, attempt: int) -> Points:
        """These points where they are for that attempt of that job; else from the start."""
        if (self.job_id, self.attempt) == (job_id, attempt):
            return self
        return Points(job_id, attempt, self.batch if self.job_id == job_id else 0)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Replace `path` whole (a reader never sees half a file), readable by its owner only."""
    temporary = path.with_name(path.name + ".new")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(temporary, path)


@dataclass(frozen=True)
class Progress:
    """What follower.json keeps of the run as its follower (orchestrator.slurm.following.follow)
    has it now: the job followed, the first job's folder, the status' base, the attempts
    and the spares."""

    job: SlurmJob
    job_id: int
    first_job_dir: str | None
    base: dict
    attempts: JobAttempts
    spares: SlurmSpares | None


def save_state(record: RunRecord, following: Following, progress: Progress) -> None:
    """follower.json: `following` and the run's `progress`."""
    spares = progress.spares
    write_json(
        record.path / STATE_FILE,
        {
            "version": VERSION,
            "following": to_plain(following),
            "job": to_plain(progress.job),
            "job_id": progress.job_id,
            "first_job_dir": progress.first_job_dir,
            "base": progress.base,
            "attempts": {
                "entries": to_plain(progress.attempts.entries),
                "given": progress.attempts.given,
                "left": progress.attempts.left,
                "preempted_seen": progress.attempts.preempted_seen,
            },
            "spares": None
            if spares is None
            else {
                "recoveries": to_plain(spares.recoveries),
                "unreplaced": spares.unreplaced,
                "left": spares.left,
                "before": spares.before,
            },
        },
    )


def save_points(record: RunRecord, points: Points) -> None:
    write_json(record.path / POINTS_FILE, to_plain(points))


@dataclass
class Handover:
    """What follower.json and follower-points.json say, read back."""

    following: Following
    job: SlurmJob
    job_id: int
    first_job_dir: str | None
    base: dict
    attempts: dict
    spares: dict | None
    points: Points

    def restore_attempts(self, attempts: JobAttempts) -> None:
        saved = self.attempts
        attempts.restore(
            [from_plain(JobAttempt, entry) for entry in saved["entries"]],
            saved["given"],
            saved["left"],
            saved["preempted_seen"],
        )

    def restore_spares(self, spares: SlurmSpares) -> None:
        saved = self.spares or {}
        spares.restore(
            [from_plain(Recovery, entry) for entry in saved.get("recoveries", [])],
            saved.get("unreplaced"),
            saved.get("left", spares.left),
            list(saved.get("before", [])),
        )


def load(record: RunRecord) -> Handover:
    """The run's handover; ConfigError (exit 2) where there is none or it cannot be read."""
    path = record.path / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{path} is missing: this run's controller left nothing to take over from (a "
            "run launched by an older orchestrator, or not a SLURM run); `orchestrator "
            "status`, `logs` and `stop` still work from the record"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    try:
        points_text = (record.path / POINTS_FILE).read_text(encoding="utf-8")
        points = from_plain(Points, json.loads(points_text))
    except FileNotFoundError:
        points = Points()
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{record.path / POINTS_FILE}: cannot read it: {exc}") from None
    try:
        if state.get("version") != VERSION:
            raise ValueError(f"version {state.get('version')}, this orchestrator reads {VERSION}")
        return Handover(
            from_plain(Following, state["following"]),
            from_plain(SlurmJob, state["job"]),
            int(state["job_id"]),
            state["first_job_dir"],
            dict(state["base"]),
            dict(saved(state, "attempts")),  # or an older name (record/older_names.py)
            state["spares"],
            points,
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{path}: not a follower state this orchestrator reads: {exc}") from None


def cut_logs(logs_dir: Path, points: Points) -> None:
    """Cut every log back to its length in `points` (what came after is read again from
    its source); a log not in them was begun after them, and is emptied."""
    if points.logs is None or not logs_dir.is_dir():
        return
    for entry in os.scandir(logs_dir):
        if not entry.is_file():
            continue
        size = points.logs.get(entry.name, 0)
        if entry.stat().st_size > size:
            os.truncate(entry.path, size)


class Reading(Protocol):
    """Where a follower reads from (following/follow.py's Follower): what its points keep."""

    job_id: int
    attempt: int
    batch: RankFile  # the batch script's output
    files: AttemptFiles | None  # the attempt's node files
    sink: LogSink  # the attempt's
    sup: Supervisor | None  # the attempt's, once one runs


class Bookmarks:
    """The follower's side of follower-points.json: where the current attempt starts (a
    follower before this one's points, or the start), how far each node agent's stream has
    been handled, and each log's length, kept across the attempts' sinks."""

    def __init__(self, record: RunRecord, given: Points | None) -> None:
        self.record = record
        self.given = given or Points()
        self.logs = dict(self.given.logs or {})
        self.agents: dict[str, int] = {}
        self.written: Points | None = None

    def start(self, job_id: int, attempt: int) -> Points:
        """Where to read that attempt's sources from."""
        points = self.given.of(job_id, attempt)
        self.agents = dict(points.agents or {})
        return points

    @staticmethod
    def restore(sup: Supervisor, points: Points) -> None:
        """Put the nodes' and ranks' states `points` kept into a new `Supervisor`."""
        for node in sup.nodes:
            for name, value in (points.nodes or {}).get(str(node.index), {}).items():
                setattr(node, name, value)
        for rank in sup.ranks.values():
            for name, value in (points.ranks or {}).get(str(rank.rank), {}).items():
                setattr(rank, name, value)

    def heard(self, node: int, channel: Any, end: int) -> None:
        """A frame of node `node`'s agent, its stream's bytes through it `end`, is handled."""
        self.agents[str(node)] = getattr(channel, "start", 0) + end

    def keep_sizes(self, sink: LogSink) -> None:
        """The lengths of the logs `sink` wrote (after its flush), before it is replaced."""
        self.logs.update({n: f.size for n, f in sink.files.items() if f.start is not None})

    def save(self, at: Reading) -> None:
        """Write the points of the follower's pass just done, if any moved."""
        self.keep_sizes(at.sink)
        sup = at.sup
        points = Points(
            at.job_id,
            at.attempt,
            at.batch.position(),
            at.files.positions() if at.files is not None else {},
            dict(self.agents),
            dict(self.logs),
            fields_of(sup.nodes if sup else [], NODE_FIELDS),
            fields_of(sup.ranks.values() if sup else [], RANK_FIELDS),
        )
        if points != self.written:
            save_points(self.record, points)
            self.written = points


def hold_lock(record: RunRecord) -> int:
    """Take the record's follower lock for this process's life (its file descriptor);
    ConfigError where another controller holds it."""
    fd = os.open(record.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"run {record.run_id} is followed by another controller (it holds "
            f"{record.path / LOCK_FILE}); `orchestrator logs {record.run_id} -f` shows it"
        ) from None
    return fd


def fields_of(states: Any, names: tuple[str, ...]) -> dict[str, dict]:
    """A node's index or a rank's number -> those fields of its state."""
    return {
        str(state.rank if hasattr(state, "local_rank") else state.index): {
            name: getattr(state, name) for name in names
        }
        for state in states
    }
