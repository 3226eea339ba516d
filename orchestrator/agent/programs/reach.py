"""Do the job's TCP paths work? (standard library only)

Shipped to every node by the preflight and by `orchestrator check`, and run there by the
node's interpreter as `python -c SOURCE ...` through the node agents, all nodes at once.
It proves two kinds of path, the way torchrun's store and gloo/NCCL's mesh use them:

- the store: on the master it opens a temporary listener on the rendezvous port, bound the
  way torchrun's store binds it (all interfaces, SO_REUSEADDR); every node (the master too)
  connects to MASTER_ADDR:PORT from the address of the interface chosen for NCCL/gloo, as
  they bind to it, retrying while nothing listens yet (the master may start a moment after
  the others), and registers there;
- the peers (--serve): every node first opens a listener of its own on that address (a port
  the kernel picks, as gloo does) and registers its port with the master's listener, which
  sends every registered node the table of the others' addresses and ports once all have
  registered (or its wait is over). Each node then connects to the peers it was given
  (--peers), all at once, and its listener answers the peers it expects (--from).

When the store connection fails it also tries the master's sshd port from the same address
(blocked port or unreachable master?) and the connection from every other address of the
node (--alt IFNAME=ADDR,...: which interface would work). Output: key=value lines (`main`).
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import sys
import threading
import time

RETRY_S = 0.1
LINGER_S = 1.5  # the store's time for the missing nodes' other addresses, after the table
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


def indices(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


class Listener:
    """Accepts connections that send `TOKEN NODE PORT` and answers `TOKEN ok` until the
    nodes in `expect` were heard or `deadline`, all connections at once (one select loop: a
    peer that is slow to say its line holds up no other). With `table`, the connections of
    nodes that registered a port (> 0) are held, and each is sent the table of every
    registered node (`TOKEN table NODE=ADDR:PORT ...`) at the end: the master's store."""

    def __init__(self, server: socket.socket, token: str, table: bool) -> None:
        self.server, self.token, self.table = server, token, table
        self.heard: dict[str, tuple[str, int]] = {}
        self.held: list[socket.socket] = []
        self.expect: set[str] | None = None  # None: any `count` nodes (set by `serve`)
        self.done = threading.Event()

    def serve(self, count: int, deadline: float) -> None:
        waiting: dict[socket.socket, tuple[str, bytes]] = {}  # peer address, bytes read
        closing: set[socket.socket] = set()  # answered: wait for the node to close first
        watch = selectors.DefaultSelector()  # epoll: a wait costs what is ready, not all
        watch.register(self.server, selectors.EVENT_READ)
        with self.server, watch:
            while time.monotonic() < deadline and not (self._all_heard(count) and not waiting):
                self._step(watch, waiting, closing)
            if self.table:
                self._send_table()
                self.table = False
                # A node that is still missing may try its other addresses (--alt): answer
                # them for a moment more, so the report can name one that works.
                linger = time.monotonic() + LINGER_S
                while not self._all_heard(count) and time.monotonic() < linger:
                    self._step(watch, waiting, closing)
            for sock in [*waiting, *closing]:
                sock.close()
        self.done.set()

    def _step(self, watch: selectors.BaseSelector, waiting: dict, closing: set) -> None:
        """One wait: a new connection, a node's line, or a node that closed."""
        for key, _ in watch.select(0.05):
            sock = key.fileobj
            if sock is self.server:
                conn, peer = self.server.accept()
                waiting[conn] = (peer[0].removeprefix("::ffff:"), b"")
                watch.register(conn, selectors.EVENT_READ)
            elif sock in waiting:
                self._read(sock, waiting, closing)
                if sock not in waiting and sock not in closing:  # closed, or held for the table
                    watch.unregister(sock)
            else:  # the node closed (its TIME_WAIT, not the listener's port's)
                closing.discard(sock)
                watch.unregister(sock)
                sock.close()

    def _all_heard(self, count: int) -> bool:
        if self.expect is not None:
            return self.expect <= set(self.heard)
        return len(self.heard) >= count

    def _read(self, conn: socket.socket, waiting: dict, closing: set) -> None:
        address, data = waiting[conn]
        try:
            chunk = conn.recv(256)
        except OSError:
            chunk = b""
        data += chunk
        if chunk and b"\n" not in data and len(data) < 256:
            waiting[conn] = (address, data)
            return
        del waiting[conn]
        words = data.decode(errors="replace").split()
        if len(words) != 3 or words[0] != self.token or not words[2].isdigit():
            conn.close()
            return
        try:
            conn.sendall(f"{self.token} ok\n".encode())
        except OSError:
            conn.close()
            return
        self.heard[words[1]] = (address, int(words[2]))
        if self.table and int(words[2]) > 0:
            self.held.append(conn)
        else:
            closing.add(conn)

    def _send_table(self) -> None:
        entries = " ".join(f"{n}={a}:{p}" for n, (a, p) in self.heard.items() if p > 0)
        for conn in self.held:
            try:
                conn.sendall(f"{self.token} table {entries}\n".encode())
            except OSError:
                pass
            conn.close()


def open_listener(host: str, port: int, token: str, table: bool) -> Listener | str:
    """A listener on host:port ("" and the rendezvous port: the store's way), or the error."""
    family = socket.AF_INET6 if not host and socket.has_dualstack_ipv6() else socket.AF_INET
    try:
        server = socket.create_server(
            (host, port), family=family, dualstack_ipv6=family == socket.AF_INET6, backlog=256
        )
    except OSError as exc:
        return describe(exc)
    return Listener(server, token, table)


def attempt(
    address: tuple, source: str | None, hello: str, token: str, timeout: float
) -> tuple[float, socket.socket, bytes]:
    """One connection that says `hello`: (connect time, the open socket, what came after the
    answer's line: the store may send its table right behind it), or OSError."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if source:
            sock.bind((source, 0))
        sock.settimeout(max(0.05, timeout))
        started = time.monotonic()
        sock.connect(address)
        took = time.monotonic() - started
        sock.sendall(f"{token} {hello}\n".encode())
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        line, _, rest = data.partition(b"\n")
        if line.decode(errors="replace").split() != [token, "ok"]:
            raise ConnectionError(
                "the port answered, but not the check's listener (something else listens there?)"
            )
        return took, sock, rest
    except BaseException:
        sock.close()
        raise


def connect(
    address: tuple, source: str | None, hello: str, token: str, timeout: float, wait: float
) -> tuple[float, socket.socket, bytes] | BaseException:
    """Connect, retrying a refusal for `wait` s (nothing listens yet); the error otherwise."""
    refusals_end = time.monotonic() + wait
    deadline = time.monotonic() + max(wait, timeout)
    failures = 0
    last: BaseException = TimeoutError()
    while time.monotonic() < deadline:
        try:
            return attempt(address, source, hello, token, min(timeout, deadline - time.monotonic()))
        except ConnectionRefusedError as exc:  # nothing listens yet: the master is starting
            last = exc
            if time.monotonic() >= refusals_end:
                return exc
        except TimeoutError as exc:
            return exc
        except OSError as exc:
            last = exc
            failures += 1
            if failures >= GIVE_UP_AFTER:
                return exc
        time.sleep(RETRY_S)
    return last


def failure(exc: BaseException, timeout: float, wait: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    reason = describe(exc)
    return reason + (f" for {wait:g} s" if isinstance(exc, ConnectionRefusedError) and wait else "")


def reach_store(args: Args, port: int) -> tuple[socket.socket, bytes] | None:
    """Connect to the store and register; say what happened; the held socket (and what
    came behind the answer) or None."""
    try:
        infos = socket.getaddrinfo(args.host, args.port, socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        say("reach", "error")
        say("reach_error", f"cannot resolve {args.host}: {exc}")
        return None
    address = infos[0][4]
    hello = f"{args.node} {port}"
    got = connect(address, args.source or None, hello, args.token, args.timeout, args.wait)
    if isinstance(got, BaseException):
        say("reach", "error")
        say("reach_error", failure(got, args.timeout, args.wait))
        diagnose(args, address)
        return None
    took, sock, rest = got
    say("reach", "ok")
    say("reach_ms", f"{took * 1e3:.3f}")
    return sock, rest


def diagnose(args: Args, address: tuple) -> None:
    """The store from every other address of the node (while the store still answers),
    then the master's sshd port from the same address."""
    for item in args.alt.split(","):
        name, _, addr = item.partition("=")
        if not addr or addr == args.source:
            continue
        try:
            attempt(address, addr, f"{args.node} 0", args.token, min(args.timeout, 1.0))[1].close()
        except OSError:
            continue
        say("reach_alt", f"{name} {addr}")
        break
    try:
        with socket.create_connection(
            (args.host, args.sshd_port),
            timeout=2.0,
            source_address=(args.source, 0) if args.source else None,
        ):
            say("sshd_port", "ok")
    except OSError as exc:
        say("sshd_port", describe(exc))


def read_table(
    sock: socket.socket, data: bytes, token: str, timeout: float
) -> dict[int, tuple[str, int]]:
    """The master's table of registered nodes: {node: (address, port)}."""
    sock.settimeout(timeout)
    try:
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    finally:
        sock.close()
    words = data.decode(errors="replace").split()
    if words[:2] != [token, "table"]:
        return {}
    table = {}
    for entry in words[2:]:
        node, _, where = entry.partition("=")
        addr, _, port = where.rpartition(":")
        table[int(node)] = (addr, int(port))
    return table


def reach_peers(args: Args, table: dict[int, tuple[str, int]]) -> None:
    """Connect to every peer given, all at once from one thread (non-blocking sockets: on a
    busy node a thread per peer would queue on the interpreter's lock for seconds); say
    `peer_N=ok MS` or `peer_N=error ADDR:PORT WHY`."""
    found: dict[int, str] = {}
    pending: dict[socket.socket, list] = {}  # peer, started, reply so far, connected at
    watch = selectors.DefaultSelector()  # epoll: a wait costs what is ready, not all
    watching: set[socket.socket] = set()  # registered with `watch`

    def fail(sock: socket.socket, exc: BaseException) -> None:
        peer = pending.pop(sock)[0]
        if sock in watching:
            watching.discard(sock)
            watch.unregister(sock)
        sock.close()
        addr, port = table[peer]
        found[peer] = f"error {addr}:{port} {failure(exc, args.timeout, 0)}"

    for peer in indices(args.peers):
        if peer not in table:
            found[peer] = "skipped (it did not register with the master)"
            continue
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        pending[sock] = [peer, time.monotonic(), b"", None]
        try:
            if args.source:
                sock.bind((args.source, 0))
            code = sock.connect_ex(table[peer])
        except OSError as exc:
            fail(sock, exc)
            continue
        if code not in (0, errno.EINPROGRESS):
            fail(sock, OSError(code, os.strerror(code)))
            continue
        watch.register(sock, selectors.EVENT_WRITE)
        watching.add(sock)
    hello = f"{args.token} {args.node} 0\n".encode()
    deadline = time.monotonic() + args.timeout
    while pending and time.monotonic() < deadline:
        for key, _ in watch.select(0.05):
            sock = key.fileobj
            state = pending.get(sock)
            if state is None:
                continue
            if state[3] is None:  # the handshake ended, one way or the other
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    fail(sock, OSError(code, os.strerror(code)))
                    continue
                state[3] = time.monotonic()
                try:
                    sock.send(hello)
                except OSError as exc:
                    fail(sock, exc)
                    continue
                watch.modify(sock, selectors.EVENT_READ)
                continue
            try:
                chunk = sock.recv(256)
            except OSError as exc:
                fail(sock, exc)
                continue
            state[2] += chunk
            if chunk and b"\n" not in state[2]:
                continue
            if state[2].decode(errors="replace").split() != [args.token, "ok"]:
                fail(sock, ConnectionError("the port answered, but not the check's listener"))
                continue
            found[state[0]] = f"ok {(state[3] - state[1]) * 1e3:.3f}"
            del pending[sock]
            watching.discard(sock)
            watch.unregister(sock)
            sock.close()
    for sock in list(pending):
        fail(sock, TimeoutError())
    watch.close()
    for peer in sorted(found):
        say(f"peer_{peer}", found[peer])


# The command line: --NAME VALUE (attribute, type, default; None: required) and flags.
# Parsed by hand: argparse's import and parser cost a node ~5 ms of CPU, a sixth of what the
# check costs it in all.
OPTIONS = {
    "--host": ("host", str, None),  # MASTER_ADDR
    "--port": ("port", int, None),  # MASTER_PORT
    "--source": ("source", str, ""),  # the local address to connect from
    "--token": ("token", str, None),
    "--node": ("node", str, None),  # this node's index
    "--timeout": ("timeout", float, 5.0),  # for one connection
    "--wait": ("wait", float, 0.0),  # retry a refused store for
    "--sshd-port": ("sshd_port", int, 22),
    "--alt": ("alt", str, ""),  # IFNAME=ADDR,... to try when the store fails
    "--listen": ("listen", int, 0),  # open the store's listener, wait for N nodes (master)
    "--peers": ("peers", str, ""),  # the nodes to connect to (after the table)
    "--from": ("incoming", str, ""),  # the nodes that connect here
}
FLAGS = {"--no-connect": "no_connect", "--serve": "serve"}  # only listen; serve the peers


class Args:
    """The parsed command line, one attribute per option (OPTIONS, FLAGS)."""


def usage(problem: str) -> SystemExit:
    print(f"orchestrator-reach: {problem}", file=sys.stderr)
    return SystemExit(2)


def parse(argv: list[str]) -> Args:
    """The options, or SystemExit(2) with what is wrong on stderr."""
    args = Args()
    for name, _, default in OPTIONS.values():
        setattr(args, name, default)
    for name in FLAGS.values():
        setattr(args, name, False)
    words = iter(argv)
    for word in words:
        if word in FLAGS:
            setattr(args, FLAGS[word], True)
            continue
        if word not in OPTIONS:
            raise usage(f"unknown argument {word!r}")
        name, kind, _ = OPTIONS[word]
        value = next(words, None)
        if value is None:
            raise usage(f"{word} needs a value")
        try:
            setattr(args, name, kind(value))
        except (TypeError, ValueError):
            raise usage(f"{word} needs a {kind.__name__}") from None
    missing = [word for word, (name, _, default) in OPTIONS.items() if default is None
               and getattr(args, name) is None]  # fmt: skip
    if missing:
        raise usage(f"missing {', '.join(missing)}")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    args.wait = max(args.wait, args.timeout)
    started = time.monotonic()
    store = None
    if args.listen:
        store = open_listener("", args.port, args.token, table=args.serve)
        if isinstance(store, str):
            say("listen_error", store)
            store = None
        else:
            say("listen", "ok")
            end = started + args.wait + 0.5  # a node that connects at all does so at once
            threading.Thread(target=store.serve, args=(args.listen, end), daemon=True).start()
    peers = open_listener(args.source, 0, args.token, table=False) if args.serve else None
    if isinstance(peers, str):
        say("serve_error", peers)
        peers = None
    port = peers.server.getsockname()[1] if peers is not None else 0
    held = None if args.no_connect else reach_store(args, port)
    if held is not None and peers is not None:
        table = read_table(*held, args.token, args.wait + args.timeout + 2.0)
        peers.expect = {str(n) for n in indices(args.incoming) if n in table}
        listening = threading.Thread(
            target=peers.serve, args=(0, time.monotonic() + args.timeout + 1.0), daemon=True
        )
        listening.start()
        reach_peers(args, table)
        listening.join()
        say("peers_heard", ",".join(sorted(peers.heard, key=int)))
    elif held is not None:
        held[0].close()
    elif peers is not None:
        peers.server.close()
    if store is not None:
        store.done.wait()
        say("heard", ",".join(sorted(store.heard, key=int)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
