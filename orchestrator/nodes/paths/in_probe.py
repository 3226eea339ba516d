"""The path check folded into the preflight probe: every node's probe interpreter, once it
has its facts, runs reach.py in the same process, so the check costs no second round of
node agents and interpreters (~30 of the ~70 ms of CPU the check cost a node as a round of
its own, measured by benchmarks/preflight_paths.py).

The probe renders each node's reach.py arguments before it knows anything of the nodes, so
the fold needs MASTER_PORT first: the given --master-port, or for `auto` a port drawn here
from the range the kernel draws its own from (AUTO_PORTS), which the master's probe checks
free by binding it, as it checks a given one (a port that is not free there is reported,
and the check runs as a round of its own after the probe, with the port the master's kernel
picked: `usable`). Each node binds the address of its job's interface (--ifname, the
hostfile's, or the one routing to MASTER_ADDR, as the plan chooses it), found by the probe
itself.

The launch folds the check when the preflight probes every node once, in node-rank order:
not with --spares (a spare that replaces a node changes the set), nor for a node that fails
its probe (the probe's own error ends the launch first)."""

from __future__ import annotations

import base64
import marshal
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib.util import MAGIC_NUMBER

from orchestrator.nodes.paths.found import PathNode, PathReport, read_report
from orchestrator.nodes.paths.pairs import Schedule
from orchestrator.nodes.paths.prove import PATH_TIMEOUT_S, STORE_NODE, node_args, reach_source

AUTO_PORTS = (32768, 60999)  # Linux's default ip_local_port_range


@cache
def reach_bytecode() -> str:
    code = compile(reach_source(), "reach.py", "exec", optimize=2)  # no docstrings
    return f"{MAGIC_NUMBER.hex()}:{base64.b64encode(marshal.dumps(code)).decode()}"


@dataclass
class Fold:
    """The check of `n` nodes as the probe runs it; `outputs` are what each node said."""

    n: int
    port: int
    auto: bool  # the port was drawn here for --master-port auto
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    timeout: float = PATH_TIMEOUT_S
    sshd_port: int = 22
    outputs: dict[int, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def for_launch(cls, n: int, master_port: int | None, sshd_port: int = 22) -> Fold:
        if master_port is not None:
            return cls(n, master_port, auto=False, sshd_port=sshd_port)
        port = secrets.SystemRandom().randint(*AUTO_PORTS)
        return cls(n, port, auto=True, sshd_port=sshd_port)

    @cached_property
    def schedule(self) -> Schedule:
        """Who connects to whom: drawn once, from the token, for every node's arguments."""
        return Schedule.of(self.n, self.token)

    def args(self, index: int, master_addr: str) -> list[str]:
        """reach.py's arguments for node `index` but --source and --alt (the probe's)."""
        return node_args(
            self.schedule, index, master_addr, self.port, token=self.token,
            timeout=self.timeout, sshd_port=self.sshd_port,
        )  # fmt: skip

    @staticmethod
    def source() -> str:
        return reach_source()

    @staticmethod
    def bytecode() -> str:
        """reach.py compiled here, as `MAGIC:BASE64`: a node whose interpreter has the same
        magic number loads it instead of compiling the source (~7 ms of CPU on a node)."""
        return reach_bytecode()

    def usable(self, nodes: Sequence[PathNode], port: int) -> bool:
        """Did the probe prove these nodes' paths to `port`? Not when the set of nodes or
        the port differs from what it was run with, a node did not run it, or the master
        could not listen (the port was taken)."""
        master = self.outputs.get(STORE_NODE, {})
        return (
            port == self.port
            and [node.index for node in nodes] == list(range(self.n))
            and all("reach" in self.outputs.get(node.index, {}) for node in nodes)
            and master.get("listen") == "ok"
        )

    def report(self, nodes: Sequence[PathNode], master_addr: str) -> PathReport:
        return read_report(nodes, self.outputs, master_addr, self.port)
