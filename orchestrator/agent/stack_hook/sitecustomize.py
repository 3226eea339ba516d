"""In every Python process of a rank: write all threads' stacks on a signal, and torch's
flight recorder on request, for the agent.

The node script puts this folder first on PYTHONPATH, so each interpreter of the job imports
this file at start-up (site.py's `import sitecustomize`). Where ORCHESTRATOR_STACKS_DIR is set,
it registers faulthandler on STACKS_SIGNAL and announces itself in `<dir>/<pid>.ready`; the
agent (orchestrator.agent.stacks) then signals it when py-spy cannot read the process.

faulthandler writes from its C signal handler, without the GIL and without the main thread's
help, so the dump comes even while the main thread is blocked inside C++ (a gloo or NCCL
collective, a lock, a recv): a Python-level handler would only run once that call returned.

The signal: SIGRTMIN + 5. Real-time signals mean nothing by convention, Python never installs
a handler for one and torch does not either, so registering it takes nothing from the
program; they queue, so two requests give two dumps. Their default action ends the process,
so the agent signals only a process that announced itself here, started at the time the
ready file names (not a reused pid), and whose /proc/PID/status shows the signal caught
(SigCgt) at that moment: never one this hook is not in. The number itself is written to the
ready file, as libcs place SIGRTMIN differently.

chain=False: chaining would re-raise the signal to its previous disposition, the default,
which ends the process; chain=True also drops SA_RESTART, so blocking calls in the program
would see EINTR.

Successive dumps: the file is opened once, O_APPEND, and faulthandler appends each dump; the
agent (one per node) notes the size before it signals and reads what was added (see
orchestrator.agent.stacks). A file per dump would need a new file for each signal, which a
C-level handler we cannot write in Python would have to open. A process forked from this
one (a DataLoader worker) inherits the registration and the file, at the descriptor the
ready file names (`fd`): the agent reads such a child through it (agent/child_stacks.py).

The flight recorder (torch's record of each rank's last collectives): where
ORCHESTRATOR_FLIGHT_DIR is set and the process is a rank (RANK set), one thread waits on a
named pipe, `<dir>/.<pid>.fifo`, blocked in open() until the agent writes to it, so it costs
nothing meanwhile. Then, if the process has a process group, it writes torch's dump to
`<dir>/rank_<RANK>` (the name torch's own dump on an NCCL timeout takes, and its analyser
reads) and a word to `<dir>/.<pid>.flight`: `ok`, or why there is none. A thread, because
only a thread can call torch while the main thread waits inside a collective (which lets go
of the GIL); a signal's Python handler would wait for the collective to return. It is the
one thread we add, started with _thread (no `threading` import at start-up), and the agent
leaves it out of the stacks it reports.

It must not disturb the program: it changes no signal the program set (it skips a signal
whose disposition is not the default), adds no thread but the flight recorder's, raises
nothing of its own (a failure only leaves the process without the hook), and imports the
user's own sitecustomize, if any further down sys.path, as Python would have without us.
Standard library only; it runs on whatever interpreter the job uses.
"""

from __future__ import annotations

import os
import sys

DIR_ENV = "ORCHESTRATOR_STACKS_DIR"
FLIGHT_ENV = "ORCHESTRATOR_FLIGHT_DIR"
HIGH_FD = 500  # the dump's descriptor is moved up here, away from the numbers a program reuses


def install(folder: str) -> None:
    """Register the dump on the signal and write the ready file (see the module docstring)."""
    import _signal  # signal's C half: the module signal.py costs every start its enums
    import faulthandler
    import fcntl

    signum = _signal.SIGRTMIN + 5
    if _signal.getsignal(signum) != _signal.SIG_DFL:
        return  # someone else's signal (or ignored, inherited): leave it alone
    pid = os.getpid()
    os.makedirs(folder, mode=0o700, exist_ok=True)
    stacks = os.path.join(folder, f"{pid}.stacks")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
    fd = os.open(stacks, flags, 0o600)
    try:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
    except OSError:
        high = fd  # a low limit on descriptors: keep the first one
    else:
        os.close(fd)
    faulthandler.register(signum, file=high, all_threads=True, chain=False)
    with open(f"/proc/{pid}/stat", "rb") as handle:
        stat = handle.read()
    start = stat[stat.rfind(b")") + 2 :].split()[19].decode()  # field 22: start time, ticks
    main = main_thread_ident()
    ready = os.path.join(folder, f"{pid}.ready")
    text = f"signal {signum}\nstart {start}\nmain_thread {main}\nstacks {stacks}\nfd {high}\n"
    write_whole(ready, text.encode())  # whole or absent: the agent never reads half a file

    import atexit

    atexit.register(forget, pid, (ready, stacks))


def main_thread_ident() -> int:
    """This (the main) thread's id as faulthandler prints it, without importing threading."""
    import _thread

    return _thread.get_ident()


def forget(pid: int, paths: tuple[str, ...]) -> None:
    """At a normal exit, remove our files (not in a forked child, which shares the handler)."""
    if os.getpid() != pid:
        return
    for path in paths:
        try:
            os.remove(path)
        except OSError:
            pass


def start_flight(folder: str) -> None:
    """In a rank: the thread that writes torch's flight recorder when asked (see above)."""
    import _thread

    rank = os.environ.get("RANK", "")
    if not rank.isdigit():
        return  # torchrun itself, or a tool the job runs: not a rank
    pid = os.getpid()
    fifo = os.path.join(folder, f".{pid}.fifo")
    if os.path.lexists(fifo):
        os.remove(fifo)  # an earlier process's with this pid
    os.mkfifo(fifo, 0o600)
    _thread.start_new_thread(serve_flight, (fifo, folder, rank, pid))

    import atexit

    atexit.register(forget, pid, (fifo, os.path.join(folder, f".{pid}.flight")))


def serve_flight(fifo: str, folder: str, rank: str, pid: int) -> None:
    """Wait for the agent's word on the pipe; dump; again."""
    while True:
        try:
            with open(fifo, "rb") as pipe:  # blocks until the agent opens it to write
                pipe.read()
        except OSError:
            return  # the pipe is gone: the run's folder was removed
        try:
            data, word = flight_dump(), b"ok"
        except Exception as error:
            data, word = None, f"{type(error).__name__}: {error}".encode(errors="replace")
        try:
            if data is not None:
                write_whole(os.path.join(folder, f"rank_{rank}"), data)
            write_whole(os.path.join(folder, f".{pid}.flight"), word)
        except OSError:
            return


def flight_dump() -> bytes:
    """torch's flight recorder of this process's collectives: the pickle its analyser reads."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise LookupError("no process group in this process (torch.distributed not initialized)")
    c10d = sys.modules["torch"]._C._distributed_c10d  # torch is there: it holds dist

    # Without each entry's Python stack: turning the captured frames into text imports
    # torch._dynamo on the first dump (1.6 s of one core idle; 8 ranks of a 2-core node took
    # over 5 s), and the stacks taken just before show where every rank waits anyway.
    if "nccl" in str(dist.get_backend()) and hasattr(c10d, "_dump_nccl_trace"):
        return c10d._dump_nccl_trace(includeStackTraces=False)
    return c10d._dump_fr_trace(includeStackTraces=False)


def write_whole(path: str, data: bytes) -> None:
    partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    with open(partial, "wb") as handle:
        handle.write(data)
    os.replace(partial, path)


def chain_user_sitecustomize() -> None:
    """Import the sitecustomize this folder hides, if there is one further down sys.path.

    Our folder is left out of sys.path for the search and put back after, at its place,
    keeping what the user's module changed there. An error in the user's module propagates:
    site.py then reports it as it would have without us.
    """
    own = os.path.dirname(os.path.abspath(__file__))
    hidden = [(i, p) for i, p in enumerate(sys.path) if os.path.abspath(p or os.curdir) == own]
    for index, _path in reversed(hidden):
        del sys.path[index]
    ours = sys.modules.pop("sitecustomize", None)
    try:
        __import__("sitecustomize")  # the user's, found without our folder
    except ImportError as error:
        if error.name != "sitecustomize":
            raise
        if ours is not None:
            sys.modules["sitecustomize"] = ours  # none of theirs: we stay the one imported
    finally:
        for index, path in hidden:
            sys.path.insert(index, path)


_folder = os.environ.get(DIR_ENV)
if _folder:
    try:
        install(_folder)
    except Exception:
        pass  # no hook in this process; the agent reports that it found none
_flight = os.environ.get(FLIGHT_ENV)
if _flight:
    try:
        start_flight(_flight)
    except Exception:
        pass  # no flight recorder dump from this process; the agent says so
chain_user_sitecustomize()
