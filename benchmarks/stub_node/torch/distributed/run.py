"""torchrun for the scale harness: the node script's torchrun line, without torch.

Every node but node 0 becomes `torchrun.sh` at once (bash: starts the node's ranks with the
variables torchrun gives them, stops them all when one fails or a stop signal comes).
Node 0 also serves the store at MASTER_PORT, which the other nodes wait for before they
start (the node script's orchestrator_torchrun): this process stays, accepts connections
and closes them, and ends with its torchrun.sh, passing on the stop signals it gets.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from pathlib import Path

TORCHRUN_SH = str(Path(__file__).resolve().parents[2] / "torchrun.sh")


def options(argv: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for arg in argv:
        if arg == "--no-python":
            break
        key, _, value = arg.partition("=")
        found[key.lstrip("-").replace("-", "_")] = value
    return found


def serve_store(port: int) -> None:
    listener = socket.create_server(("", port), reuse_port=False, backlog=1024)
    while True:
        connection, _ = listener.accept()
        connection.close()


def main() -> int:
    argv = sys.argv[1:]
    if options(argv).get("node_rank", "0") != "0":
        os.execvp("bash", ["bash", TORCHRUN_SH, *argv])
    port = int(options(argv)["master_port"])
    threading.Thread(target=serve_store, args=(port,), daemon=True).start()
    child = os.fork()
    if child == 0:
        os.execvp("bash", ["bash", TORCHRUN_SH, *argv])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: os.kill(child, number))
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) & 0xFF


if __name__ == "__main__":
    sys.exit(main())
