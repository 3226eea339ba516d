"""The agent's heartbeat in real time: a real agent process runs a command that talks for
4 s and then is quiet for 3; the heartbeat frames it sends meanwhile are timed. About 10 s
of waiting, so it is not among the unit tests (the rest of the protocol is
tests/unit/agent/test_protocol.py)."""

from __future__ import annotations

from orchestrator.agent import encode_config
from orchestrator.backends.sessions import FrameParser
from tests.unit.agent.test_protocol import start_agent


def test_a_steady_heartbeat_waits_while_the_agent_writes_other_frames() -> None:
    """While output goes out, one H in BEATS_DEFERRED + 1 beats (3 + 1); quiet, one a beat."""
    import threading
    import time

    from orchestrator.agent.protocol import AGENT_BEATS, BEATS_DEFERRED, FIRST_BEAT_S, FIRST_BEATS

    timeout = 1.5  # steady beats every 0.5 s; the first FIRST_BEATS every 0.5 s too
    pause = timeout / AGENT_BEATS
    first = FIRST_BEATS * min(FIRST_BEAT_S, pause)
    loud, quiet = 4.0, 3.0
    script = f"sleep {first + 0.5}; end=$((SECONDS + {loud:.0f})); "
    script += "while [ $SECONDS -lt $end ]; do echo tick; sleep 0.1; done; "
    script += f"echo quiet; sleep {quiet}"
    proc = start_agent()
    config = {"argv": ["bash", "-c", script], "heartbeat_timeout": timeout}
    proc.stdin.write(encode_config(config))
    proc.stdin.flush()
    done = threading.Event()

    def ping() -> None:  # the controller's side: an hb twice a second
        while not done.wait(0.5):
            try:
                proc.stdin.write(f"hb {time.time():.6f}\n".encode())
                proc.stdin.flush()
            except OSError:
                return

    threading.Thread(target=ping, daemon=True).start()
    parser, arrivals = FrameParser(), []  # (monotonic time, kind, payload)
    try:
        while not any(kind == "X" for _, kind, _ in arrivals):
            chunk = proc.stdout.read1(65536)
            assert chunk, proc.stderr.read().decode()
            now = time.monotonic()
            arrivals += [(now, kind, data) for kind, _, data in parser.feed(chunk)]
    finally:
        done.set()
        proc.stdin.close()
        proc.wait(timeout=30)
    ticks = [t for t, kind, data in arrivals if kind == "N" and b"tick" in data]
    went_quiet = next(t for t, kind, data in arrivals if kind == "N" and b"quiet" in data)
    end = next(t for t, kind, _ in arrivals if kind == "X")
    beats = [t for t, kind, _ in arrivals if kind == "H"]
    while_loud = [t for t in beats if ticks[0] + pause < t <= ticks[-1]]
    while_quiet = [t for t in beats if went_quiet + pause < t < end]
    loud_s, quiet_s = ticks[-1] - ticks[0] - pause, end - went_quiet - pause
    assert len(while_quiet) >= quiet_s / pause - 2, while_quiet  # one a beat
    assert len(while_loud) <= loud_s / pause / (BEATS_DEFERRED + 1) + 1, while_loud
    assert len(while_loud) / loud_s < len(while_quiet) / quiet_s / 2
    sent = sorted(beats + ticks)
    gaps = [b - a for a, b in zip(sent, sent[1:], strict=False)]
    assert max(gaps) < pause * 2.5  # something went out at least about every beat
