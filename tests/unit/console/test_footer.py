"""launch's footer: one summary line kept under the stream on a terminal, never mixed into
a log line, made at most once a second, cut to the terminal's width, gone before the
closing lines; none in a pipe or with --no-footer. The launch on a real terminal is
tests/local/test_footer_launch.py."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

from orchestrator.console.footer import PREFIX, Footer
from orchestrator.console.progress import CLEAR
from orchestrator.console.rank_table import duration, summary
from orchestrator.console.sink import LogSink
from orchestrator.options.supervision import Supervision
from tests.factories import FakeClock, supervisor

COLOUR = re.compile(rb"\x1b\[[0-9;]*m")


def shown(raw: bytes) -> list[str]:
    """What a terminal shows: each line as its last redraw left it, without colours."""
    raw = COLOUR.sub(b"", raw.replace(b"\r\n", b"\n"))
    return [line.split(CLEAR)[-1].decode(errors="replace") for line in raw.split(b"\n")]


def test_the_footer_stays_under_the_lines_and_is_made_at_most_once_a_second() -> None:
    console, clock = io.BytesIO(), FakeClock()
    footer = Footer(console, clock, width=60)
    sink = LogSink(None, {0: "n0 r0"}, {0: "n0"}, console, False, footer=footer)
    made = []

    def text() -> str:
        made.append(clock.now)
        return f"running, step {len(made)}"

    sink.update_footer(text)
    sink.flush()
    assert console.getvalue() == CLEAR + f"{PREFIX}running, step 1".encode()
    sink.rank_output(0, b"one\ntwo\n")
    sink.update_footer(text)  # not due yet: the same text, drawn again after the lines
    sink.flush()
    clock.now += 1.0
    sink.update_footer(text)
    sink.flush()
    assert made == [100.0, 101.0]
    raw = console.getvalue()
    assert shown(raw) == ["[n0 r0] one", "[n0 r0] two", f"{PREFIX}running, step 2"]
    # The lines were written after the footer was taken away, never into it.
    assert CLEAR + b"[n0 r0] one\n" in raw
    sink.end_footer()
    sink.note("run x succeeded")
    sink.update_footer(text)
    sink.flush()
    assert shown(console.getvalue())[-2:] == ["[orchestrator] run x succeeded", ""]
    assert made == [100.0, 101.0]


def test_the_footer_is_cut_to_the_terminal_width() -> None:
    console = io.BytesIO()
    footer = Footer(console, FakeClock(), width=30)
    footer.update(lambda: "x" * 100)
    line = shown(console.getvalue())[-1]
    assert len(line) < 30 and line.endswith("...") and line.startswith(PREFIX)


def test_no_footer_but_on_a_terminal() -> None:
    assert Footer.on(io.BytesIO()) is None
    assert Footer.on(None) is None


def test_the_summary_says_states_step_rate_and_stragglers() -> None:
    status = {
        "state": "running",
        "ranks": [
            {"rank": 0, "host": "a", "state": "running"},
            {"rank": 1, "host": "b", "state": "running"},
            {"rank": 2, "host": "b", "state": "failed"},
        ],
        "stragglers": [{"rank": 1, "why": "work"}],
    }
    metrics = {
        0: (1.0, {"step": 120, "samples_per_s": 1000.0}),
        1: (1.0, {"step": 118, "samples_per_s": 500.5}),
    }
    assert summary(status, metrics) == (
        "running, 3 rank(s) on 2 node(s) (1 failed, 2 running), step 118, "
        "1,500 samples/s, 1 straggler(s) (rank 1)"
    )
    assert summary({"state": "starting"}, {}) == "starting, 0 rank(s) on 0 node(s) ()"


def test_the_summary_says_how_long_every_rank_has_been_quiet() -> None:
    status = {"state": "running", "ranks": [{"rank": 0, "host": "a", "state": "running"}]}
    head = "running, 1 rank(s) on 1 node(s) (1 running)"
    assert summary(status, {}, quiet_s=130.4, check_s=300.0) == (
        f"{head}, quiet 2m10s (hang check at 5m)"
    )
    assert summary(status, {}, quiet_s=130.4) == f"{head}, quiet 2m10s"  # no hang checks
    assert summary(status, {}, quiet_s=302.0, check_s=300.0).endswith(
        ", quiet 5m02s (checking for a hang)"
    )
    assert summary(status, {}, quiet_s=30.0, check_s=300.0) == head  # 30 s: not yet said


def test_float_noise_in_a_silence_does_not_take_a_second_off() -> None:
    """(t + 300) - t is 299.99999999999994 for some monotonic t (the fresh-clone run's
    footer said `hang check at 4m59s` once); a real fraction is still cut down."""
    t = 16084.005  # the first such t in milliseconds from 10 000 s (a search of 1.5 s)
    assert (t + 300.0) - t < 300
    assert duration((t + 300.0) - t) == "5m"
    assert duration(299.6) == "4m59s" and duration(130.9) == "2m10s"


def footer_of(tmp_path: Path, hang_timeout: float, quiet: float) -> str:
    """launch's footer of a supervisor whose ranks last said something `quiet` s ago."""
    supervision = Supervision(grace=1, heartbeat_timeout=0, hang_timeout=hang_timeout)
    sup = supervisor(tmp_path, ("a",), supervision=supervision)
    for rank in (0, 1):
        sup.metrics.heard_from(rank, time.time() - quiet - rank)
    sup.hangs.heard(time.monotonic() - quiet)
    return sup.footer_text()


def test_launchs_footer_says_how_long_every_rank_has_been_quiet(tmp_path: Path) -> None:
    assert footer_of(tmp_path, 300.0, 130.2).endswith(", quiet 2m10s (hang check at 5m)")
    assert footer_of(tmp_path, 0.0, 130.2).endswith(", quiet 2m10s")
    assert "quiet" not in footer_of(tmp_path, 300.0, 5.0)


def test_the_summary_says_when_the_run_goes_on_with_fewer_nodes_than_launched() -> None:
    ranks = [{"rank": r, "host": f"n{r + 1}", "state": "running"} for r in range(3)]
    world = [{"nodes": ["n0", "n1", "n2", "n3"]}, {"nodes": ["n1", "n2", "n3"]}]
    status = {"state": "running", "ranks": ranks, "world": world}
    assert summary(status, {}).startswith("running, 3 rank(s) on 3 node(s) of the 4 launched (")
    assert "launched" not in summary({**status, "world": world[1:]}, {})  # as launched
    assert "launched" not in summary({**status, "world": []}, {})  # no world: over SLURM
