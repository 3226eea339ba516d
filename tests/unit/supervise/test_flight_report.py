"""torch's flight recorder, as the controller keeps and reads it (supervise/flight_report.py)
and as the agent turns it on (agent/flight.py): the analyser's report read, gloo's dumps
mended, dumps that name a class refused, the job's own settings kept."""

from __future__ import annotations

import collections
import pickle
from pathlib import Path

import pytest

from orchestrator.agent.flight import BUFFER_ENTRIES, FLIGHT_DIR_ENV, flight_environment
from orchestrator.agent.flight import take_one as take_dump
from orchestrator.supervise.flight_report import (
    FlightReport,
    Missing,
    load_plain,
    mend,
    read_report,
)

DATA = Path(__file__).resolve().parents[2] / "data"


def test_the_analysers_report_names_the_collective_and_the_missing_ranks() -> None:
    # torch 2.13's own report over a 2-rank gloo job whose rank 1 never reached the
    # all_reduce (captured from a real run: tests/data/flight_analysis.txt)
    found = read_report((DATA / "flight_analysis.txt").read_text())
    assert found == [
        Missing(1, "gloo:all_reduce", "0:default_pg", (1,), "hang_job.py:22 (<module>)")
    ]


def test_a_finding_reads_as_one_line_with_hosts() -> None:
    missing = Missing(4, "nccl:all_reduce", "0:default_pg", (5, 6), "train.py:40 (step)")
    report = FlightReport(Path("/r/flight"), (missing,), (0, 1, 2, 3, 4, 5, 6, 7), {})
    (line,) = report.lines({5: "node3", 6: "node4"})
    assert line == (
        "flight recorder: ranks r[5-6] (node[3-4]) never joined collective #4 "
        "(nccl:all_reduce, group 0:default_pg) that the other ranks entered, called at "
        "train.py:40 (step) "
        "(/r/flight/analysis.txt)"
    )
    assert report.status()["missing"][0]["ranks"] == [5, 6]


def test_no_dump_at_all_says_why() -> None:
    report = FlightReport(Path("/r/flight"), (), (), {0: "LookupError: no process group"})
    assert report.lines({}) == [
        "flight recorder: no rank's dump came (LookupError: no process group)"
    ]


def test_gloo_dumps_get_their_groups_name() -> None:
    dump = {
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
        "entries": [{"process_group": ("0", "default_pg"), "collective_seq_id": 1}],
    }
    assert mend(dump)["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    named = {"pg_config": {"0": {"name": "0"}}, "entries": dump["entries"]}
    assert mend(named) is named  # a dump torch named right is left as it is


def test_a_dump_that_names_a_class_is_refused() -> None:
    assert load_plain(pickle.dumps({"entries": [], "version": "2.10"})) == {
        "entries": [], "version": "2.10"
    }  # fmt: skip
    with pytest.raises(pickle.UnpicklingError, match="collections.OrderedDict"):
        load_plain(pickle.dumps(collections.OrderedDict(a=1)))


def test_the_flight_recorder_is_on_unless_the_job_set_it(tmp_path: Path) -> None:
    env = flight_environment({"PATH": "/bin"}, str(tmp_path))
    assert env["TORCH_FR_BUFFER_SIZE"] == str(BUFFER_ENTRIES)
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == f"{tmp_path}/rank_"
    assert env[FLIGHT_DIR_ENV] == str(tmp_path)
    own = flight_environment(
        {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, "/f"
    )
    assert "TORCH_FR_BUFFER_SIZE" not in own  # the job's older name for it wins
    assert own["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"


def test_a_process_without_the_hook_is_named_so(tmp_path: Path) -> None:
    said = take_dump(3, 999_999, str(tmp_path), timeout=1.0)
    assert said.startswith("no flight recorder hook in this process")
