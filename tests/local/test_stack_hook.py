"""The ranks' stack hook (orchestrator/agent/stack_hook/sitecustomize.py) in real
interpreters: it announces itself only where asked, leaves the program's signals and its own
sitecustomize as they were, steps aside for a signal the program inherited ignored, and
cleans up at exit (not at a forked child's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.agent.flight import flight_environment, take_dumps
from orchestrator.agent.stacks import STACKS_DIR_ENV, hook_environment
from orchestrator.supervise.flight_report import load_plain

HOOK = str(Path(__file__).resolve().parents[2] / "orchestrator" / "agent" / "stack_hook")
SIGNUM = int(signal.SIGRTMIN) + 5

REPORT = """\
import os, signal, sys
sitecustomize = sys.modules.get("sitecustomize")
print("module", getattr(sitecustomize, "__file__", None))
print("path", sys.path.index(sys.argv[1]) if sys.argv[1] in sys.path else -1)
print("user", os.environ.get("USER_SITE_RAN"), getattr(sitecustomize, "USER", None))
print("handlers", [str(signal.getsignal(s)) for s in sorted(signal.valid_signals())])
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print("caught", int(status["SigCgt"], 16))
print("fds", sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                    if int(fd) >= 500))
"""


def run(tmp_path: Path, pythonpath: list[str], hook_dir: Path | None, code: str = REPORT):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", STACKS_DIR_ENV)}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    if hook_dir is not None:
        env[STACKS_DIR_ENV] = str(hook_dir)
    script = tmp_path / "report.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script), HOOK], env=env, capture_output=True, text=True, timeout=60
    )


def lines_of(result: subprocess.CompletedProcess) -> dict[str, str]:
    assert result.returncode == 0, result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


def user_site(tmp_path: Path, body: str) -> str:
    folder = tmp_path / "user_site"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(body)
    return str(folder)


def test_the_user_s_own_sitecustomize_still_runs_after_ours(tmp_path: Path) -> None:
    user = user_site(tmp_path, "import os\nos.environ['USER_SITE_RAN'] = 'yes'\nUSER = 'theirs'\n")
    hook_dir = tmp_path / "stacks"
    for pythonpath, asked in (([user], None), ([HOOK, user], hook_dir), ([HOOK, user], None)):
        shown = lines_of(run(tmp_path, pythonpath, asked))
        assert shown["module"] == str(Path(user) / "sitecustomize.py")
        assert shown["user"] == "yes theirs"
        if pythonpath[0] == HOOK:
            assert shown["path"] == "1"  # back where it was: after the script's folder
        caught = int(shown["caught"]) >> (SIGNUM - 1) & 1
        assert caught == (asked is not None)  # on the path but not asked for: nothing done
    assert list(hook_dir.iterdir()) == []  # the ready and stacks files: gone at exit


def test_without_a_user_sitecustomize_ours_stays_the_one_imported(tmp_path: Path) -> None:
    shown = lines_of(run(tmp_path, [HOOK], tmp_path / "stacks"))
    assert shown["module"] == str(Path(HOOK) / "sitecustomize.py")


def test_a_failing_user_sitecustomize_is_reported_as_without_us(tmp_path: Path) -> None:
    user = user_site(tmp_path, "raise RuntimeError('boom')\n")
    alone = run(tmp_path, [user], None, "print('ran')\n")
    hooked = run(tmp_path, [HOOK, user], tmp_path / "stacks", "print('ran')\n")
    assert "Error in sitecustomize" in alone.stderr and "RuntimeError: boom" in alone.stderr
    assert (hooked.stdout, hooked.stderr) == (alone.stdout, alone.stderr)


def test_the_program_s_signals_are_as_without_the_hook_but_for_ours(tmp_path: Path) -> None:
    hook_dir = tmp_path / "stacks"
    plain = lines_of(run(tmp_path, [], None))
    hooked = lines_of(run(tmp_path, [HOOK], hook_dir))
    assert hooked["handlers"] == plain["handlers"]  # what the program sees: all the same
    assert int(hooked["caught"]) ^ int(plain["caught"]) == 1 << (SIGNUM - 1)
    (stacks,) = eval(hooked["fds"])  # the dump's descriptor, out of the way of low numbers
    assert stacks.startswith(str(hook_dir)) and stacks.endswith(".stacks")


def test_an_inherited_ignored_signal_is_left_alone(tmp_path: Path) -> None:
    hook_dir = tmp_path / "stacks"
    env = hook_environment(dict(os.environ), HOOK, str(hook_dir))
    code = "import signal; print(signal.getsignal(signal.SIGRTMIN + 5) == signal.SIG_IGN)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(SIGNUM, signal.SIG_IGN),
    )
    assert result.stdout.strip() == "True"
    assert not hook_dir.exists() or not list(hook_dir.iterdir())


def test_files_are_removed_at_exit_but_not_by_a_forked_child(tmp_path: Path) -> None:
    hook_dir = tmp_path / "stacks"
    code = (
        "import os, sys\n"
        f"ready = {str(hook_dir)!r} + f'/{{os.getpid()}}.ready'\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    sys.exit(0)  # a normal exit: the inherited atexit handler runs here\n"
        "os.waitpid(child, 0)\n"
        "print('kept', os.path.exists(ready))\n"
    )
    shown = lines_of(run(tmp_path, [HOOK], hook_dir, code))
    assert shown["kept"] == "True"
    assert list(hook_dir.iterdir()) == []


FLIGHT_JOB = """\
import sys, time
import torch, torch.distributed as dist
if sys.argv[2] == "group":
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[3]}", rank=0, world_size=1)
    dist.all_reduce(torch.ones(2))
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("group", [True, False])
def test_a_rank_dumps_its_flight_recorder_when_the_agent_asks(tmp_path: Path, group: bool) -> None:
    """The hook's flight thread in a real rank: the agent's byte on the pipe gets torch's
    dump (a gloo all_reduce in it) from a rank with a process group, and why not from one
    without."""
    flight = tmp_path / "flight"
    flight.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", STACKS_DIR_ENV)}
    env.update(flight_environment({"PYTHONPATH": HOOK, "RANK": "0"}, str(flight)))
    script = tmp_path / "rank.py"
    script.write_text(FLIGHT_JOB)
    argv = [sys.executable, str(script), HOOK, "group" if group else "none", str(tmp_path / "s")]
    rank = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout is not None and rank.stdout.readline() == "ready\n"
        (dump,) = take_dumps({0: rank.pid}, str(flight), 10.0).values()
    finally:
        rank.terminate()
        rank.wait(30)
    if group:
        assert isinstance(dump, bytes)
        entries = load_plain(dump)["entries"]
        assert [e["profiling_name"] for e in entries] == ["gloo:all_reduce"]
        assert (flight / "rank_0").read_bytes() == dump
    else:
        assert dump == (
            "LookupError: no process group in this process (torch.distributed not initialized)"
        )
