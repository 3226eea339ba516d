"""The launcher's one way into a SLURM job's node agents: one step for the whole allocation.

The launcher runs a single `srun --overlap --jobid JOB --ntasks-per-node=1` over the nodes it
follows, whatever their number (orchestrator.slurm.following.agents). Each task runs this
program on its node: it connects to the node's keeper socket (relay.py) when told to, and carries
that agent's stream both ways over the step's own standard streams, which SLURM already
carries between the launcher and every node (its slurmstepd tree), authenticated and placed by
SLURM: no port to open, no secret to hand out, and two srun processes on the launcher's host
at any node count, where a step per node cost two each.

srun gives every task the whole of its stdin and merges the tasks' stdout by whole lines
(a line of 1 000 bytes is never split or mixed with another task's: measured on the lab's
SLURM). So the records are lines, their payloads base64, each addressed by node index:

    launcher -> tasks (every task reads every line, and takes its own):
      d INDEX HOST OFFSET   the task on HOST is node INDEX: dial its keeper, stream from OFFSET
                            (a dial already open is replaced: the keeper takes the newest)
      s INDEX BASE64        bytes for node INDEX's agent (its commands)
    tasks -> launcher:
      o INDEX BASE64        bytes of node INDEX's agent stream (the keeper's `at` line first)
      c INDEX BASE64        node INDEX's dial ended, and why; the task waits for another `d`

A task ends when its stdin does (the launcher hung up or left): the agents go on, they
belong to the job.

Run on the nodes as `python -I -S -u -c SOURCE PATHS WAIT`, PATHS the keeper socket's path
with `{}` for the node's index, WAIT how long a dial waits for the socket to appear.
"""

from __future__ import annotations

import base64
import os
import select
import socket
import sys
import time

CHUNK_BYTES = 600  # a record's payload before base64: its line stays under 1 000 bytes


def main(paths: str, wait: float) -> None:
    me = os.environ.get("SLURMD_NODENAME", "")
    conn, index, pending = None, None, b""

    def say(kind: bytes, data: bytes) -> None:
        lines = [
            b"%s %d %s\n" % (kind, index, base64.b64encode(data[at : at + CHUNK_BYTES]))
            for at in range(0, max(len(data), 1), CHUNK_BYTES)
        ]
        out = b"".join(lines)
        while out:
            out = out[os.write(1, out) :]

    while True:
        ready = select.select([0] + ([conn] if conn else []), [], [])[0]
        if conn is not None and conn in ready:
            try:
                data, why = conn.recv(1 << 16), "the node's agent closed its end"
            except OSError as exc:
                data, why = b"", str(exc)
            if data:
                say(b"o", data)
            else:
                conn.close()
                conn = None
                say(b"c", why.encode())
        if 0 not in ready:
            continue
        data = os.read(0, 1 << 16)
        if not data:
            return  # the launcher hung up: the agent goes on
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            words = line.split()
            if len(words) == 4 and words[0] == b"d" and words[2].decode() == me:
                if conn is not None:
                    conn.close()
                index = int(words[1])
                conn = dial(paths.format(index), int(words[3]), wait)
                if isinstance(conn, str):
                    why, conn = conn, None
                    say(b"c", why.encode())
            elif len(words) == 3 and words[0] == b"s" and conn and int(words[1]) == index:
                try:
                    conn.sendall(base64.b64decode(words[2]))
                except OSError:
                    pass  # its end comes as the connection's


def dial(path: str, offset: int, wait: float) -> socket.socket | str:
    """The keeper's socket, its stream asked from `offset`; or why not, after `wait` s."""
    deadline = time.monotonic() + wait
    while True:
        try:
            st = os.stat(os.path.dirname(path))
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                return f"{os.path.dirname(path)} is not a folder of this user's alone"
        except FileNotFoundError:
            pass
        one = socket.socket(socket.AF_UNIX)
        try:
            one.connect(path)
            one.sendall(b"from %d\n" % offset)
            return one
        except OSError as exc:
            one.close()
            if time.monotonic() > deadline:
                return f"no node agent at {path} on this node: {exc.strerror}"
        time.sleep(0.2)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
