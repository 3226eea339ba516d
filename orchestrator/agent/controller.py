"""Whether the controller's host is still there, as a node sees it.

An agent that hears nothing from its controller for the heartbeat timeout must tell a
controller that is gone (its machine down, the link cut: stop the run) from one that is only
slow (a loaded login node, a stopped process: wait). A controller process that dies closes
its connections, and the agent's stdin ends at once; so what is left to tell apart is the
host. Its kernel answers a TCP connection attempt to the address and port the SSH connection
comes from (sshd's SSH_CLIENT), accepted or refused, while the host is up and reachable; a
dead host or a cut link gives no answer. Through a jump host, that address is the jump
host's: the last hop the node can see.

Standard library only: this module runs on the nodes too (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import os
import threading

ASK_TIMEOUT_S = 3.0  # no answer within this is no answer
ASK_EVERY_S = 5.0


class ControllerHost:
    """Asks, in the background, whether the controller's host answers."""

    def __init__(self, ssh_client: str | None = None) -> None:
        words = (os.environ.get("SSH_CLIENT", "") if ssh_client is None else ssh_client).split()
        self.address = (words[0], int(words[1])) if len(words) >= 2 and words[1].isdigit() else None
        self.result: bool | None = None
        self.asked_at = float("-inf")
        self.thread: threading.Thread | None = None

    def answers(self, now: float) -> bool | None:
        """The last answer (None while the first question is out); asks again now and then.

        Not over SSH (a local agent), the controller is this machine: always there.
        """
        if self.address is None:
            return True
        asking = self.thread is not None and self.thread.is_alive()
        if not asking and now - self.asked_at >= ASK_EVERY_S:
            self.asked_at = now
            self.thread = threading.Thread(target=self._ask, name="controller-host", daemon=True)
            self.thread.start()
        return self.result

    def forget(self) -> None:
        """The controller was heard again: a later silence asks anew."""
        self.result = None
        self.asked_at = float("-inf")

    def _ask(self) -> None:
        assert self.address is not None
        self.result = host_answers(self.address, ASK_TIMEOUT_S)


def host_answers(address: tuple[str, int], timeout: float) -> bool:
    """A TCP connection attempt: accepted or refused, the host's kernel answered."""
    import socket  # here, not at the top: only a silent controller needs it (4 ms a start)

    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except ConnectionRefusedError:
            return True
        except OSError:  # timed out, unreachable, no route
            return False
    return True
