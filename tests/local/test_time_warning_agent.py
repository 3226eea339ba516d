"""The agent's side of the time limit's warning (orchestrator.agent.limit_warning.warn_ranks),
on real processes: the signal goes to each rank's own process that catches it (a Python
rank, or what a rank's non-Python wrapper started), never to one that would die of it or
ignores it, and the G frame says when and to whom."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from orchestrator.agent.limit_warning import warn_ranks

RANK = textwrap.dedent("""
    import os, signal, sys, time
    rank, how, folder = os.environ["RANK"], sys.argv[1], sys.argv[2]
    def checkpoint(signum, frame):
        open(os.path.join(folder, f"rank-{rank}.ckpt"), "w").write(str(time.time()))
        sys.exit(128 + signum)
    if how == "catch":
        signal.signal(signal.SIGUSR1, checkpoint)
    elif how == "ignore":
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    open(os.path.join(folder, f"rank-{rank}.ready"), "w").close()
    time.sleep(60)
""")


def test_warn_ranks_signals_the_ranks_that_catch_it_and_says_which(tmp_path: Path) -> None:
    (tmp_path / "rank.py").write_text(RANK)
    py, script, folder = sys.executable, tmp_path / "rank.py", tmp_path
    # rank 3 is not Python: its wrapper (bash, holding RANK, as run_rank) runs a shell
    # script that traps USR1; the wrapper itself would die of it
    (folder / "rank3.sh").write_text(
        f"trap 'touch {folder}/rank-3.ckpt; exit 7' USR1\ntouch {folder}/rank-3.ready\n"
        "while :; do sleep 0.05; done\n"
    )
    tree = (
        f"RANK=0 {py} {script} catch {folder} & RANK=1 {py} {script} ignore {folder} & "
        f"RANK=2 {py} {script} default {folder} & "
        f"RANK=3 bash -c 'bash {folder}/rank3.sh; echo wrapper ends' & wait"
    )
    root = subprocess.Popen(["bash", "-c", tree], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not all((folder / f"rank-{r}.ready").exists() for r in range(4)):
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.02)
        time.sleep(0.1)  # rank 3's shell has set its trap before it touched the file
        before = time.time()
        head = warn_ranks(root.pid, "USR1").decode()
        kind, name, when, sent, skipped = head.split()
        assert (kind, name, sent, skipped) == ("G", "USR1", "0,3", "1,2"), head
        assert before <= float(when) <= time.time()
        deadline = time.monotonic() + 10
        while not all((folder / f"rank-{r}.ckpt").exists() for r in (0, 3)):
            assert time.monotonic() < deadline, "no checkpoint after the warning"
            time.sleep(0.02)
        assert float((folder / "rank-0.ckpt").read_text()) >= float(when)
        assert not (folder / "rank-1.ckpt").exists() and not (folder / "rank-2.ckpt").exists()
        assert warn_ranks(root.pid, "TERM").decode().split()[3] == "-"  # only USR1/USR2
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()
