"""How the controller starts an agent on a node: the command line and the source it sends.

The node's interpreter runs `BOOTSTRAP`, which reads one length-prefixed source from stdin
and executes it. That source is `loader.py` and a call of its `install` with the agent's
modules (NODE_MODULES, in dependency order), then the agent's `main()`: the agent is a
package here and one process there, and the node needs nothing but a Python interpreter.
"""

from __future__ import annotations

from importlib import resources

# Run by the node's interpreter: read a length-prefixed source from stdin and execute it.
BOOTSTRAP = (
    "import os\n"
    "def read_exact(n):\n"
    "    data = b''\n"
    "    while len(data) < n:\n"
    "        chunk = os.read(0, n - len(data))\n"
    "        if not chunk:\n"
    "            raise SystemExit('orchestrator agent: the controller went away')\n"
    "        data += chunk\n"
    "    return data\n"
    "exec(compile(read_exact(int(read_exact(8))), 'orchestrator-agent', 'exec'))\n"
)

# The agent's modules as they run on the node, each after those it imports.
NODE_MODULES = (
    "protocol",
    "shipping",
    "disk",
    "ranks",
    "processes",
    "controller",
    "sampling",
    "wakeup",
    "main",
)

_AGENT_SOURCE: bytes | None = None


def agent_argv(python: str, tag: str) -> list[str]:
    """How a node's interpreter starts the agent.

    Isolated (-I: no PYTHON* variables, no user site) and without site (-S): the agent
    needs the standard library alone, and skipping site-packages and their .pth files
    saves CPU on every node at every start (45 -> 38 ms for a whole `exec` step in a
    venv with torch). The job's own processes get the environment as it is.
    """
    return [python, "-I", "-S", "-u", "-c", BOOTSTRAP, "orchestrator-agent", tag]


def agent_source() -> bytes:
    """What BOOTSTRAP executes: the loader, the agent's modules, and a call of its main()."""
    global _AGENT_SOURCE
    if _AGENT_SOURCE is None:
        package = resources.files(__package__)
        modules = [
            (f"{__package__}.{name}", package.joinpath(f"{name}.py").read_text())
            for name in NODE_MODULES
        ]
        _AGENT_SOURCE = (
            package.joinpath("loader.py").read_text() + f"\nsys.exit(install({modules!r}).main())\n"
        ).encode()
    return _AGENT_SOURCE
