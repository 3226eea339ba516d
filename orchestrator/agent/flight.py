"""torch's flight recorder on the node: turned on for the ranks, dumped when the controller asks.

The flight recorder is torch's ring of each rank's last collectives (which, in which group,
with which sizes, started or finished, called from where). The node script's environment
turns it on, unless the job set the variables itself: TORCH_FR_BUFFER_SIZE entries, and on
NCCL a dump when a collective times out (TORCH_NCCL_DUMP_ON_TIMEOUT) into this node's
`flight/` folder (TORCH_FR_DUMP_TEMP_FILE), named `rank_<RANK>`; after a failure the agent
sends what torch wrote there (`dumps_left`). These are torch 2.13's names: it warns, on
every rank, of the older TORCH_NCCL_TRACE_BUFFER_SIZE and TORCH_NCCL_DEBUG_INFO_TEMP_FILE,
so they are not set here, and a job that sets them keeps its own. Each collective costs the
rank the record of its Python stack: up to ~30 us on 2 CPU cores, 1.01-1.07x a loop of tiny
all_reduces (benchmarks/flight_recorder.py); the ring holds BUFFER_ENTRIES.

gloo (and so every job on CPU) records too, but dumps on no timeout. So the agent asks for
a dump itself, through each rank's stack hook (stack_hook/sitecustomize.py): a byte to the
rank's named pipe `flight/.<pid>.fifo`, after which that rank's thread writes
`flight/rank_<RANK>` and then `flight/.<pid>.flight` saying `ok` or why there is no dump
(no process group yet, say). `take_dumps` does that for every rank at once, after the
stacks of a hang check's second sample are taken (so that the stacks show no rank dumping).

Standard library only: this module runs on the nodes too (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import errno
import os
import time

from orchestrator.agent.processes import own_pid
from orchestrator.agent.stacks import each_rank

FOLDER = "flight"  # in the node directory
PREFIX = "rank_"  # a dump's name: PREFIX + the rank, as torch's analyser expects
FLIGHT_DIR_ENV = "ORCHESTRATOR_FLIGHT_DIR"  # read by the hook: where the pipe and dumps go
BUFFER_ENTRIES = 2000  # the ring's length: about a hundred steps of a DDP job's collectives
POLL_S = 0.01


def flight_environment(env: dict[str, str], folder: str) -> dict[str, str]:
    """`env` with the flight recorder on, dumping into `folder`; what the job (`env`, or the
    node script's own exports after it) sets wins."""
    own = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    if "TORCH_FR_BUFFER_SIZE" not in env and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
        own["TORCH_FR_BUFFER_SIZE"] = str(BUFFER_ENTRIES)
    if "TORCH_FR_DUMP_TEMP_FILE" not in env and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env:
        own["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(folder, PREFIX)
    return {**own, **env, FLIGHT_DIR_ENV: folder}


def take_dumps(ranks: dict[int, int], folder: str, timeout: float) -> dict[int, bytes | str]:
    """rank -> its dump (bytes), or why there is none (str); every rank asked at once."""
    return each_rank(
        ranks,
        lambda rank, pid: take_one(rank, pid, folder, timeout),
        lambda rank, pid, why: why,
    )


def take_one(rank: int, pid: int, folder: str, timeout: float) -> bytes | str:
    pid = own_pid(pid)  # the hook names its files by the pid it sees (in a container, its own)
    word = os.path.join(folder, f".{pid}.flight")
    try:
        os.remove(word)
    except OSError:
        pass
    deadline = time.monotonic() + timeout
    if not poke(os.path.join(folder, f".{pid}.fifo"), min(deadline, time.monotonic() + 0.5)):
        return "no flight recorder hook in this process (not a rank the hook started in)"
    while time.monotonic() < deadline:
        try:
            with open(word, "rb") as handle:
                said = handle.read().decode(errors="replace").strip()
        except FileNotFoundError:
            time.sleep(POLL_S)
            continue
        if said != "ok":
            return said or "no dump"
        with open(os.path.join(folder, f"{PREFIX}{rank}"), "rb") as handle:
            return handle.read()
    return f"no dump within {timeout:g} s"


def poke(fifo: str, until: float) -> bool:
    """Write a byte to the rank's pipe; False where no thread reads it. The reader reopens
    the pipe after each dump, so a refusal (ENXIO) is tried again until `until`."""
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as error:
            if error.errno != errno.ENXIO or time.monotonic() >= until:
                return False
            time.sleep(POLL_S)
            continue
        try:
            os.write(fd, b"d")
        finally:
            os.close(fd)
        return True


def dumps_left(folder: str, since: float, asked: dict[int, float]) -> dict[int, bytes]:
    """rank -> the dump torch wrote by itself into `folder` since `since` (a timed-out NCCL
    collective), leaving out those written when we asked (`asked`: rank -> when)."""
    found = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    for name in sorted(names):
        rank = name[len(PREFIX) :]
        if not name.startswith(PREFIX) or not rank.isdigit():
            continue
        path = os.path.join(folder, name)
        try:
            mtime = os.stat(path).st_mtime
            if mtime < since or mtime <= asked.get(int(rank), 0.0) + 1.0:
                continue
            with open(path, "rb") as handle:
                found[int(rank)] = handle.read()
        except OSError:
            continue
    return found
