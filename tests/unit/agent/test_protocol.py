"""The agent protocol: frames (agent -> controller) and the length-prefixed bootstrap.

Frames are encoded by orchestrator.agent.frame and decoded by
orchestrator.backends.sessions.FrameParser; whatever way the bytes are cut on the way
(byte by byte, random chunks), the same frames come out. The heartbeat's timing, on a real
agent for seconds, is tests/local/test_agent_heartbeat.py.
"""

from __future__ import annotations

import marshal
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.agent import BOOTSTRAP, encode_config, frame, length_prefixed
from orchestrator.agent.bootstrap import agent_argv, agent_start
from orchestrator.agent.loader import bytecode_magic, install, read_modules
from orchestrator.agent.protocol import (
    Command,
    CommandReader,
    command_line,
    end_command,
    heartbeat_command,
    kill_command,
    next_command,
    signal_command,
    stacks_command,
    stop_command,
)
from orchestrator.backends.sessions import FrameParser

PROPERTY = settings(max_examples=60, deadline=None)

FIELD = st.one_of(
    st.integers(-5, 10**9),
    st.builds("{}.{:06d}".format, st.integers(0, 2 * 10**9), st.integers(0, 999999)),
)


@st.composite
def frames(draw) -> tuple[str, tuple[str, ...], bytes]:
    """(kind, fields, payload) as the agent sends them."""
    kind = draw(st.sampled_from("SONEFMHX"))
    if kind in FrameParser.WITH_PAYLOAD:
        fields = tuple(draw(st.lists(FIELD, max_size=1 if kind in "OF" else 0)))
        payload = draw(st.binary(max_size=60) | st.sampled_from([b"\n", b"a\nb\n", b"H 1\n"]))
    else:
        fields = tuple(draw(st.lists(FIELD, min_size=1, max_size=3)))
        payload = b""
    return kind, tuple(str(f) for f in fields), payload


def encode(kind: str, fields, payload: bytes) -> bytes:
    if kind in FrameParser.WITH_PAYLOAD:
        return frame(kind, *fields, payload=payload)
    return frame(kind, *fields)


def test_frame_encoding() -> None:
    assert frame("H", "12.5") == b"H 12.5\n"
    assert frame("E", 3, 1, "9.000000") == b"E 3 1 9.000000\n"
    assert frame("O", 2, payload=b"a\nb\n") == b"O 2 4\na\nb\n"
    assert frame("M", payload=b"") == b"M 0\n"


def test_parser_decodes_each_kind() -> None:
    data = (
        frame("S", 4242, "1.5")
        + frame("O", 0, payload=b"line\n")
        + frame("N", payload=b"torchrun\n")
        + frame("E", 0, 1, "2.0")
        + frame("F", 0, payload=b'{"message": "boom"}')
        + frame("M", payload=b"note\n")
        + frame("H", "3.0")
        + frame("U", "10.0.0.2", 29500, 6, "store", "torchrun")
        + frame("X", 1, "4.0")
    )
    assert FrameParser().feed(data) == [
        ("S", ("4242", "1.5"), b""),
        ("O", ("0",), b"line\n"),
        ("N", (), b"torchrun\n"),
        ("E", ("0", "1", "2.0"), b""),
        ("F", ("0",), b'{"message": "boom"}'),
        ("M", (), b"note\n"),
        ("H", ("3.0",), b""),
        ("U", ("10.0.0.2", "29500", "6", "store", "torchrun"), b""),
        ("X", ("1", "4.0"), b""),
    ]


def test_payload_may_hold_newlines_and_look_like_frames() -> None:
    payload = b"X 0 1.0\nH 2\n\n\x00\xff"
    data = frame("O", 1, payload=payload) + frame("X", 0, "5.0")
    assert FrameParser().feed(data) == [("O", ("1",), payload), ("X", ("0", "5.0"), b"")]


def test_blank_lines_between_frames_are_skipped() -> None:
    assert FrameParser().feed(b"\n\nH 1\n\n") == [("H", ("1",), b"")]


def test_each_frame_says_where_it_ends_in_the_stream() -> None:
    parser = FrameParser()
    first, second = frame("H", "1.0"), frame("O", 0, payload=b"a\nb\n")
    data = b"\n" + first + second
    assert [end for *_, end in parser.frames(data[:-2])] == [1 + len(first)]
    assert [end for *_, end in parser.frames(data[-2:])] == [len(data)]


def test_partial_frames_wait_for_the_rest() -> None:
    parser = FrameParser()
    data = frame("O", 7, payload=b"hello\n")
    assert parser.feed(data[:3]) == []  # header not complete
    assert parser.feed(data[3:7]) == []  # header complete, payload not
    assert parser.feed(data[7:]) == [("O", ("7",), b"hello\n")]
    assert parser.buf == b""


@PROPERTY
@given(st.lists(frames(), max_size=8))
def test_frames_survive_byte_by_byte(items) -> None:
    data = b"".join(encode(*item) for item in items)
    parser = FrameParser()
    got = []
    for i in range(len(data)):
        got += parser.feed(data[i : i + 1])
    assert got == items and parser.buf == b""


@PROPERTY
@given(st.lists(frames(), max_size=8), st.data())
def test_frames_survive_random_chunks(items, data) -> None:
    stream = b"".join(encode(*item) for item in items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    parser = FrameParser()
    got = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got += parser.feed(stream[start:end])
    assert got == items and parser.buf == b""


@pytest.mark.parametrize("header", [b"O\n", b"O -5\n", b"N x\n", b"M 1.5\n"])
def test_malformed_payload_header_is_a_value_error(header: bytes) -> None:
    with pytest.raises(ValueError):
        FrameParser().feed(header)


def test_non_numeric_payload_length_is_a_value_error() -> None:
    # The node reader turns a ValueError into an EOF event for that node.
    with pytest.raises(ValueError):
        FrameParser().feed(b"O 1 lots\n")


# --- length-prefixed bootstrap -----------------------------------------------------------


@PROPERTY
@given(st.binary(max_size=3000))
def test_length_prefixed(data: bytes) -> None:
    encoded = length_prefixed(data)
    assert len(encoded) == 8 + len(data)
    assert int(encoded[:8]) == len(data) and encoded[8:] == data


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=10,  # nested five deep and every kind of value still; 30 took 7 s a run
)


@given(st.dictionaries(st.text(), JSON, max_size=5))
def test_a_config_reads_back_as_sent(config: dict) -> None:
    encoded = encode_config(config)
    assert int(encoded[:8]) == len(encoded) - 8
    assert marshal.loads(encoded[8:]) == config
    assert encoded[8] & 0x7F == ord("{")  # a marshal dict, in the format of version 4


def test_bootstrap_runs_the_source_it_is_sent() -> None:
    source = (
        b"import sys, json\nconfig = json.loads(read_exact(int(read_exact(8))))\n"
        b"sys.stdout.write(config['say'] + ' \\u00e9')\n"
    )
    stdin = length_prefixed(source) + length_prefixed(b'{"say": "hello"}')
    result = subprocess.run(
        [sys.executable, "-c", BOOTSTRAP], input=stdin, capture_output=True, timeout=30
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode() == "hello \u00e9"


def test_bootstrap_ends_cleanly_when_the_controller_goes_away() -> None:
    stdin = length_prefixed(b"print('never')\n")[:12]  # cut short: stdin closes
    result = subprocess.run(
        [sys.executable, "-c", BOOTSTRAP], input=stdin, capture_output=True, timeout=30
    )
    assert result.returncode == 1 and b"the controller went away" in result.stderr
    assert b"never" not in result.stdout and b"Traceback" not in result.stderr


# --- the agent itself: further steps, and what its commands inherit -----------------------


def start_agent(env: dict | None = None) -> subprocess.Popen:
    from orchestrator.backends.sessions import agent_start

    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", BOOTSTRAP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdin.write(agent_start())
    return proc


def run_step(proc: subprocess.Popen, head: bytes, argv: list[str]) -> dict:
    """Send one step's config; read frames up to X; returns {kind: [(fields, data)]}."""
    proc.stdin.write(head + encode_config({"argv": argv}))
    proc.stdin.flush()
    parser, seen = FrameParser(), {}
    while "X" not in seen:
        chunk = proc.stdout.read1(65536)
        assert chunk, proc.stderr.read().decode()
        for kind, fields, data in parser.feed(chunk):
            seen.setdefault(kind, []).append((fields, data))
    return seen


def test_agent_runs_another_step_after_next_and_ends_when_stdin_closes() -> None:
    proc = start_agent()
    first = run_step(proc, b"", ["bash", "-c", "echo one $PPID"])
    # Commands meant for the finished step (a late heartbeat, a stop) are skipped.
    second = run_step(proc, b"hb\nstop 1\nnext\n", ["bash", "-c", "echo two $PPID; exit 3"])
    assert first["N"][0][1] == f"one {proc.pid}\n".encode()
    assert second["N"][0][1] == f"two {proc.pid}\n".encode()  # the same agent ran both
    assert first["X"][0][0][0] == "0" and second["X"][0][0][0] == "3"
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def test_commands_do_not_read_the_login_shell_rc_file_again(tmp_path) -> None:
    # Started by `exec python` from sshd's session shell, the agent has SHLVL=0 and
    # SSH_CLIENT; a `bash -c` it starts must not take itself for that session shell.
    (tmp_path / ".bashrc").write_text(f"touch {tmp_path}/bashrc-was-read\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SSH_CLIENT": "10.0.0.1 5000 22",
        "SHLVL": "0",
    }
    proc = start_agent(env)
    seen = run_step(proc, b"", ["bash", "-c", "echo level $SHLVL"])
    proc.stdin.close()
    proc.wait(timeout=30)
    assert seen["N"][0][1] == b"level 2\n"
    assert not (tmp_path / "bashrc-was-read").exists()


# --- commands, the loader, and the agent shipped as several modules ----------------------


def test_commands_are_read_from_whole_lines_however_they_arrive() -> None:
    reader = CommandReader()
    assert reader.feed(b"hb\nst") == []
    assert reader.feed(b"op 2.5\n\nkill\nstop\nbogus\n") == [
        ("stop", 2.5),
        ("kill", 0.0),
        ("stop", None),
    ]
    assert reader.feed(b"kil") == [] and reader.feed(b"l\n") == [("kill", 0.0)]


def test_each_command_the_controller_encodes_is_what_the_agent_decodes() -> None:
    sent = [
        stop_command(2.5),
        kill_command(),
        stacks_command(7, "py-spy", True),
        stacks_command(8, "signal", False),
        end_command([1, 3]),
        signal_command("USR1"),
        heartbeat_command(12.25),
        next_command(),  # read between steps only (next_config), not by the step's reader
    ]
    assert sent == [
        "stop 2.5",
        "kill",
        "stacks 7 py-spy flight",
        "stacks 8 signal",
        "end 1,3",
        "signal USR1",
        "hb 12.250000",
        "next",
    ]  # the wire's words, as they always were
    reader = CommandReader()
    assert reader.feed(b"".join(command_line(c) for c in sent)) == [
        (Command.STOP, 2.5),
        (Command.KILL, 0.0),
        (Command.STACKS, "7 py-spy flight"),
        (Command.STACKS, "8 signal"),
        (Command.END, "1,3"),
        (Command.SIGNAL, "USR1"),
    ]
    assert reader.ping[0] == "12.250000"


def test_loader_installs_modules_that_import_each_other() -> None:
    modules = [
        ("lab_pkg.sub.low", "VALUE = 41\n"),
        ("lab_pkg.sub.high", "from lab_pkg.sub.low import VALUE\nANSWER = VALUE + 1\n"),
        ("lab_pkg.top", "import lab_pkg.sub.high\nANSWER = lab_pkg.sub.high.ANSWER\n"),
    ]
    try:
        top = install(modules)
        assert top is sys.modules["lab_pkg.top"] and top.ANSWER == 42
        assert sys.modules["lab_pkg"].sub.high.ANSWER == 42
        assert sys.modules["lab_pkg.sub"].__path__ == []  # nothing else is found from disk
        with pytest.raises(ImportError):
            __import__("lab_pkg.sub.missing")
    finally:
        for name in [n for n in sys.modules if n == "lab_pkg" or n.startswith("lab_pkg.")]:
            del sys.modules[name]


def test_the_node_takes_the_controllers_bytecode_only_when_its_magic_matches() -> None:
    compiled = [("m", compile("FROM = 'bytecode'\n", "m.py", "exec"))]
    sources = [("m", "FROM = 'source'\n")]

    def sent(magic: bytes) -> bytes:
        parts = (
            magic,
            marshal.dumps(compiled),
            marshal.dumps(sources),
        )
        return b"".join(length_prefixed(part) for part in parts)

    def read_from(stream: bytes):
        position = 0

        def read_exact(n: int) -> bytes:
            nonlocal position
            position += n
            return stream[position - n : position]

        return read_exact

    magic = bytecode_magic()
    assert magic is not None and len(magic) == 4
    assert read_modules(read_from(sent(magic))) == compiled
    other = bytes(b ^ 0xFF for b in magic)  # another Python's bytecode: compile the source
    assert read_modules(read_from(sent(other))) == sources


def _with_magic(start: bytes, magic: bytes) -> bytes:
    """agent_start() with the compiled modules labelled for another interpreter."""
    loader_length = 8 + int(start[:8])
    assert start[loader_length : loader_length + 8] == b"00000004"
    return start[: loader_length + 8] + magic + start[loader_length + 12 :]


@pytest.mark.parametrize("magic", ["own", "other"])
def test_the_agent_runs_isolated_with_nothing_but_what_it_is_sent(tmp_path, magic) -> None:
    # As on a node: -I -S, started where no orchestrator package can be imported from.
    proc = subprocess.Popen(
        agent_argv(sys.executable, "test"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    start = agent_start()
    proc.stdin.write(start if magic == "own" else _with_magic(start, b"\0\0\0\0"))
    seen = run_step(proc, b"", ["bash", "-c", "echo isolated"])
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0, proc.stderr.read().decode()
    assert seen["N"][0][1] == b"isolated\n" and seen["X"][0][0][0] == "0"


class _Finished:
    """An agent channel that reports X once, then nothing more (the agent waits idle)."""

    def __init__(self) -> None:
        self.sent = [frame("X", 0, "1.0")]
        self.closed = False

    def read(self, size: int) -> bytes:
        return self.sent.pop(0) if self.sent else b""

    def write(self, data: bytes) -> None:
        pass

    def errors(self) -> str:
        return ""

    def close(self) -> None:
        self.closed = True


def test_an_idle_agent_counts_as_idle_from_its_x_not_from_when_the_controller_got_to_it() -> None:
    import queue
    import time
    from types import SimpleNamespace

    from orchestrator.backends.sessions import REUSE_WITHIN_S, NodeSession, take_idle_agent

    connection = SimpleNamespace(idle_agent=None)
    channel = _Finished()
    session = NodeSession(0, connection, channel, queue.Queue(), "python3", "run1")
    session.thread.start()
    session.thread.join(timeout=5)
    arrived = session.heard
    session.heard -= REUSE_WITHIN_S  # the X came in that long ago; the controller was busy
    session.close()
    assert connection.idle_agent.since == arrived - REUSE_WITHIN_S
    assert take_idle_agent(connection, "python3", "run1") is None  # may have left: not reused
    assert channel.closed and time.monotonic() >= arrived
