"""torch's flight recorder, collected: a hung run's dumps in its record, and torch's reading.

The nodes dump each rank's flight recorder after a hang check's second sample of stacks
(agent/flight.py); the dumps come back in L frames with that round. When the check finds a
hang, `collect` writes them to runs/<run-id>/flight/rank_<N> and runs torch's own analyser
(`python -m torch.distributed.flight_recorder.fr_trace`, the `torchfrtrace` command) over
that folder, keeping its whole report in flight/analysis.txt. Its finding for users is the
collective that some ranks entered and others never joined: that names, from torch's side,
the ranks the stacks found stuck. (Where the others called it comes with a dump that holds
its entries' Python stacks: a job's own, or NCCL's on a timeout; the ranks' hook leaves
them out, see agent/stack_hook/sitecustomize.py.)

The dumps are pickles written by the ranks. They are read here with an unpickler that
refuses every class (torch writes plain dicts, lists and numbers), and what is written to
the record is pickled again from what was read, so neither this controller nor someone
running torchfrtrace on the folder later unpickles anything a node could have crafted.

On the way, one fault of torch 2.13's gloo dumps is mended: their process group table is
keyed by an empty name, while their entries name the group ("0", "default_pg"), and the
analyser stops at that (KeyError). The default group's entry is put under its real name.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.agent.flight import FOLDER, PREFIX
from orchestrator.hostlist import name_ranks
from orchestrator.record.states import RunState
from orchestrator.supervise.stack_rounds import StackRounds
from orchestrator.supervise.state import Outcome

REPORT = "analysis.txt"
ANALYSER = "torch.distributed.flight_recorder.fr_trace"
ANALYSE_TIMEOUT_S = 60.0
TORCH_FILES = re.compile(r"/torch/(distributed|nn|_dynamo|utils)/")


@dataclass(frozen=True)
class Missing:
    """A collective that `missing` ranks never joined, as torch's analyser reports it."""

    seq: int
    collective: str  # "gloo:all_reduce", "nccl:all_reduce"
    group: str  # "0:default_pg"
    missing: tuple[int, ...]
    called_at: str  # the innermost frame outside torch: "train.py:40 (step)"


@dataclass(frozen=True)
class FlightReport:
    folder: Path
    missing: tuple[Missing, ...]
    dumped: tuple[int, ...]  # ranks whose dump came
    not_dumped: dict[int, str]  # rank -> why none came
    analyser_error: str = ""

    def lines(self, hosts: dict[int, str]) -> list[str]:
        """For the console and the summary: a line per finding, or what stood in the way."""
        where = self.folder / REPORT
        if not self.dumped:
            why = sorted(set(self.not_dumped.values()))
            return [f"flight recorder: no rank's dump came ({'; '.join(why)[:200]})"]
        if self.analyser_error:
            return [f"flight recorder: dumps in {self.folder}; {self.analyser_error}"]
        if not self.missing:
            return [f"flight recorder: no collective lacks a rank ({where})"]
        return [
            f"flight recorder: {name_ranks(m.missing, hosts)} never joined collective "
            f"#{m.seq} ({m.collective}, group {m.group}) that the other ranks entered"
            + (f", called at {m.called_at}" if m.called_at else "")
            + f" ({where})"
            for m in self.missing
        ]

    def status(self) -> dict:
        return {
            "folder": str(self.folder),
            "missing": [
                {
                    "seq": m.seq,
                    "collective": m.collective,
                    "group": m.group,
                    "ranks": list(m.missing),
                    "called_at": m.called_at,
                }
                for m in self.missing
            ],
            "not_dumped": {str(k): v for k, v in self.not_dumped.items()},
            **({"analyser_error": self.analyser_error} if self.analyser_error else {}),
        }


def with_flight(outcome: Outcome, rounds: StackRounds) -> Outcome:
    """A failed run's outcome, its summary saying what the dumps torch wrote by itself (a
    timed-out NCCL collective) name; the run's own summary where there are none."""
    if outcome.state != RunState.FAILED or not rounds.left or rounds.record_dir is None:
        return outcome
    try:
        report = collect(rounds.record_dir, rounds.left, {})
    except OSError:
        return outcome  # a full disk: the failure's own summary stands
    lines = [line for line in (outcome.summary, *report.lines(rounds.hosts)) if line]
    return dataclasses.replace(outcome, summary="\n".join(lines))


def collect(record_dir: Path, dumps: dict[int, bytes], not_dumped: dict[int, str]) -> FlightReport:
    """Write the dumps to the record, run torch's analyser over them, read its report."""
    folder = record_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    dumped, refused = [], dict(not_dumped)
    for rank, data in sorted(dumps.items()):
        try:
            dump = mend(load_plain(data))
        except (pickle.UnpicklingError, ValueError, EOFError, TypeError) as error:
            refused[rank] = f"unreadable dump ({error})"
            continue
        (folder / f"{PREFIX}{rank}").write_bytes(pickle.dumps(dump))
        dumped.append(rank)
    if not dumped:
        return FlightReport(folder, (), (), refused)
    text, error = analyse(folder, complete=not refused)
    (folder / REPORT).write_text(text, encoding="utf-8")
    return FlightReport(folder, tuple(read_report(text)), tuple(dumped), refused, error)


class _Plain(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"a dump may not name {module}.{name}")


def load_plain(data: bytes) -> dict:
    loaded = _Plain(io.BytesIO(data)).load()
    if not isinstance(loaded, dict):
        raise ValueError("not a flight recorder dump")
    return loaded


def mend(dump: dict) -> dict:
    """torch 2.13's gloo dumps: the default group's table entry under its name (see above)."""
    config = dump.get("pg_config")
    if not isinstance(config, dict) or "" not in config:
        return dump
    for entry in dump.get("entries") or ():
        name, desc = (list(entry.get("process_group") or ()) + ["", ""])[:2]
        if desc == "default_pg" and name and name not in config:
            config = {**config, name: {**config[""], "name": name, "desc": desc}}
            del config[""]
            return {**dump, "pg_config": config}
    return dump


def analyse(folder: Path, complete: bool) -> tuple[str, str]:
    """(the analyser's report, what went wrong or ""), run by this interpreter's torch."""
    argv = [sys.executable, "-m", ANALYSER, str(folder), "--prefix", PREFIX]
    if not complete:
        argv.append("--allow-incomplete-ranks")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=ANALYSE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "", f"torch's analyser gave no answer within {ANALYSE_TIMEOUT_S:g} s"
    except OSError as error:
        return "", f"torch's analyser could not run: {error}"
    text = done.stdout + done.stderr
    if done.returncode != 0:
        last = [line for line in text.splitlines() if line.strip()][-1:] or ["no output"]
        return text, f"torch's analyser failed ({last[0].strip()[:160]})"
    return text, ""


def read_report(text: str) -> list[Missing]:
    """The analyser's "Not all ranks joining collective" findings, in its order."""
    found = []
    for block in re.split(r"(?m)^(?=Not all ranks joining collective)", text)[1:]:
        fields = dict(re.findall(r"(?m)^([a-z ]+): (.*)$", block))
        seq = re.search(r"sequence number: (\d+)", block)
        ranks = tuple(int(r) for r in re.findall(r"\d+", fields.get("missing ranks", "")))
        trace = block.partition("collective stack trace:")[2].splitlines()
        frames = [f.strip() for f in trace if " at " in f]
        own = next((f for f in frames if not TORCH_FILES.search(f)), "")
        function, _, place = own.partition(" at ")
        called = f"{Path(place).name} ({function})" if own else ""
        found.append(
            Missing(
                int(seq.group(1)) if seq else -1,
                fields.get("collective", "?").strip(),
                fields.get("group info", "?").strip(),
                ranks,
                called,
            )
        )
    return found
