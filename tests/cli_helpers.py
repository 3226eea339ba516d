"""Running the real `orchestrator` CLI from tests, and looking at what a run left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

from tests.factories import wait_for

REPO = Path(__file__).resolve().parent.parent
ORCHESTRATOR = [sys.executable, "-m", "orchestrator"]


def run_cli(
    args: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """Run `orchestrator ARGS` to its end; returns the completed process (text)."""
    return subprocess.run(
        [*ORCHESTRATOR, *args],
        cwd=cwd,
        env=dict(env or os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_cli(
    args: Sequence[str], *, cwd: Path | str | None = None, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start `orchestrator ARGS` in the background, output to pipes (text)."""
    return subprocess.Popen(
        [*ORCHESTRATOR, *args],
        cwd=cwd,
        env=dict(env or os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_on_terminal(
    argv: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> tuple[int, bytes]:
    """Run `argv` with a pseudo-terminal of 40 x 160 as its stdout and stderr, as at a desk:
    its exit code (124 when it ran past `timeout` and was killed) and everything it wrote
    there."""
    import fcntl
    import pty
    import struct
    import termios

    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env or os.environ),
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    seen, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the program ended: the terminal is closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(primary)
    try:
        return proc.wait(timeout=max(1.0, deadline - time.monotonic())), seen
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return 124, seen


# The CLI tests' conditions read a run's files: ten times a second.
wait_until = partial(wait_for, poll=0.1)


def wait_ready(runs: Path, run_id: str, world: int, proc: subprocess.Popen) -> None:
    """Every rank of a run started in the background (`proc`) has printed `ready` in its log;
    an AssertionError when the launch ends first."""
    logs = runs / run_id / "logs"

    def ready() -> bool:
        assert proc.poll() is None, "the launch ended before its ranks were ready"
        return all(
            (logs / f"rank-{r}.log").exists() and b"ready" in (logs / f"rank-{r}.log").read_bytes()
            for r in range(world)
        )

    wait_until(ready, 240, f"{world} ranks to be ready")


def wait_for_line(path: Path, text: str, timeout: float) -> None:
    wait_until(
        lambda: path.exists() and text in path.read_text(errors="replace"),
        timeout,
        f"{text!r} in {path}",
    )


def run_pids(run_id: str) -> list[int]:
    """Pids on this machine (all lab nodes share its pid namespace) of a run's processes."""
    wanted = f"ORCHESTRATOR_RUN_ID={run_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2 :][:1] == b"Z":
            continue
        if wanted in environ.split(b"\0"):
            found.append(int(name))
    return found


def assert_nothing_left(run_id: str, within: float = 10.0) -> None:
    """Every process of the run is gone (giving them `within` seconds to go)."""
    try:
        wait_until(lambda: not run_pids(run_id), within, f"the processes of run {run_id} to end")
    except AssertionError:
        left = run_pids(run_id)
        details = []
        for pid in left:
            try:
                details.append(
                    Path(f"/proc/{pid}/cmdline")
                    .read_bytes()
                    .replace(b"\0", b" ")
                    .decode(errors="replace")[:200]
                )
            except OSError:
                pass
        raise AssertionError(f"run {run_id} left processes running: {left} {details}") from None


def status_of(run_dir: Path, run_id: str) -> dict:
    return json.loads((run_dir / run_id / "status.json").read_text())


# A rank that prints LINES lines of random length up to MAXLEN, some reaching its file in pieces;
# check_lines proves each line arrived whole, once, in order.
SPLICE = textwrap.dedent("""
    import os, random, sys, zlib
    rank = int(os.environ["RANK"])
    rng = random.Random(rank)
    out = sys.stdout
    for i in range(LINES):
        body = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(0, MAXLEN)))
        line = f"R{rank} #{i} {zlib.crc32(body.encode())} {body}\\n"
        cut = rng.randint(0, len(line))
        out.write(line[:cut])
        if rng.random() < 0.3:
            out.flush()   # a partial line reaches the file
        out.write(line[cut:])
    out.flush()
""")


def check_lines(lines: list[str], rank: int, count: int) -> None:
    assert len(lines) == count, f"rank {rank}: {len(lines)} lines, expected {count}"
    for i, line in enumerate(lines):
        head, number, crc, *body = line.split(" ", 3)
        body_text = body[0] if body else ""
        assert (head, number) == (f"R{rank}", f"#{i}"), f"rank {rank} line {i}: {line[:80]!r}"
        assert int(crc) == zlib.crc32(body_text.encode()), f"spliced: {line[:80]!r}"
