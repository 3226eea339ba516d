"""Can this node open a TCP connection to MASTER_ADDR:MASTER_PORT? (standard library only)

Shipped to every node by `orchestrator check` and run by the node's interpreter as
`python -c SOURCE ...` through the node agents, all nodes at once:

- on the master it first opens a temporary listener on the rendezvous port, bound the way
  torchrun's store binds it (all interfaces, SO_REUSEADDR), which answers a token and ends
  once every node has been heard from or its lifetime is over;
- on every node (the master too) it connects to MASTER_ADDR:PORT from the address of the
  interface chosen for NCCL/gloo, as they bind to it, retrying while nothing listens yet
  (the master's listener may start a moment after the others), until the timeout.

When the connection fails it also tries the master's sshd port from the same address, so
the report can tell "this port is blocked" from "the master is unreachable from here".
Output: key=value lines (see `main`).
"""

from __future__ import annotations

import argparse
import errno
import select
import socket
import sys
import threading
import time

RETRY_S = 0.1
GIVE_UP_AFTER = 3  # attempts for errors that waiting does not cure (no route, refused by rule)


def say(key: str, value: object) -> None:
    print(f"{key}={value}", flush=True)


def describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    code = getattr(exc, "errno", None)
    if code is not None and code in errno.errorcode:
        return f"{errno.errorcode[code]} ({exc.strerror or exc})"
    return str(exc) or type(exc).__name__


def listen(port: int, expect: int, lifetime: float, token: str, ready: threading.Event) -> None:
    """Accept connections until `expect` distinct nodes sent the token, or `lifetime` ends."""
    family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
    try:
        server = socket.create_server(
            ("", port), family=family, dualstack_ipv6=family == socket.AF_INET6
        )
    except OSError as exc:
        say("listen_error", describe(exc))
        ready.set()
        return
    say("listen", "ok")
    ready.set()
    heard: set[str] = set()
    deadline = time.monotonic() + lifetime
    with server:
        while len(heard) < expect and time.monotonic() < deadline:
            readable, _, _ = select.select([server], [], [], min(0.2, lifetime))
            if not readable:
                continue
            conn, peer = server.accept()
            with conn:
                conn.settimeout(2.0)
                try:
                    words = conn.recv(256).decode(errors="replace").split()
                    if len(words) == 2 and words[0] == token:
                        conn.sendall(f"{token} ok\n".encode())
                        heard.add(words[1])
                        conn.recv(16)  # wait for the node to close first (its TIME_WAIT)
                except OSError:
                    pass
    say("heard", ",".join(sorted(heard, key=int)))


def attempt(
    address: tuple, family: int, source: str | None, token: str, node: str, timeout: float
) -> float:
    """One connection; returns the connect time in seconds or raises OSError."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        if source:
            sock.bind((source, 0))
        sock.settimeout(max(0.05, timeout))
        started = time.monotonic()
        sock.connect(address)
        took = time.monotonic() - started
        sock.sendall(f"{token} {node}\n".encode())
        reply = sock.recv(256).decode(errors="replace").split()
        if reply != [token, "ok"]:
            raise ConnectionError(
                "the port answered, but not the check's listener (something else listens there?)"
            )
        return took


def connect(
    host: str, port: int, source: str | None, token: str, node: str, timeout: float
) -> bool:
    deadline = time.monotonic() + timeout
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        say("reach", "error")
        say("reach_error", f"cannot resolve {host}: {exc}")
        return False
    family, _, _, _, address = infos[0]
    failures = 0
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            took = attempt(address, family, source, token, node, deadline - time.monotonic())
        except ConnectionRefusedError as exc:  # nothing listens yet: the master is starting
            last = exc
        except TimeoutError as exc:
            last = exc
            break
        except OSError as exc:
            last = exc
            failures += 1
            if failures >= GIVE_UP_AFTER:
                break
        else:
            say("reach", "ok")
            say("reach_ms", f"{took * 1e3:.3f}")
            return True
        time.sleep(RETRY_S)
    say("reach", "error")
    reason = describe(last) if last is not None else "timed out"
    if isinstance(last, ConnectionRefusedError):
        reason += f" for {timeout:g} s"
    say("reach_error", reason)
    return False


def sshd_port(host: str, port: int, source: str | None) -> None:
    """For the diagnosis: is the master's sshd reachable from the same address?"""
    try:
        with socket.create_connection(
            (host, port), timeout=2.0, source_address=(source, 0) if source else None
        ):
            say("sshd_port", "ok")
    except OSError as exc:
        say("sshd_port", describe(exc))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="orchestrator-reach")
    parser.add_argument("--host", required=True, help="MASTER_ADDR")
    parser.add_argument("--port", type=int, required=True, help="MASTER_PORT")
    parser.add_argument("--source", default="", help="local address to connect from")
    parser.add_argument("--token", required=True)
    parser.add_argument("--node", required=True, help="this node's index")
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--sshd-port", type=int, default=22)
    parser.add_argument(
        "--listen",
        type=int,
        default=0,
        metavar="EXPECT",
        help="open the listener and wait for EXPECT nodes (master only)",
    )
    parser.add_argument("--no-connect", action="store_true", help="only listen")
    args = parser.parse_args(argv)
    source = args.source or None
    listener = None
    if args.listen:
        ready = threading.Event()
        lifetime = args.timeout + 2.0
        listener = threading.Thread(
            target=listen, daemon=True, args=(args.port, args.listen, lifetime, args.token, ready)
        )
        listener.start()
        ready.wait()
    connected = args.no_connect or connect(
        args.host, args.port, source, args.token, args.node, args.timeout
    )
    if not connected:
        sshd_port(args.host, args.sshd_port, source)
    if listener is not None:
        listener.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
