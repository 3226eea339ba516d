"""How the controller starts an agent on a node: the command line and what it sends.

The node's interpreter runs `BOOTSTRAP`, which reads one length-prefixed source from stdin
and executes it. That source is `loader.py` and a call of its `install`, which reads the
agent's modules (NODE_MODULES, in dependency order) from stdin as well, as bytecode and as
source, then runs the agent's `main()`: the agent is a package here and one process there,
and the node needs nothing but a Python interpreter.
"""

from __future__ import annotations

import marshal
from functools import cache
from importlib import resources
from importlib.util import MAGIC_NUMBER

from orchestrator.agent.loader import compile_module
from orchestrator.agent.protocol import encode_config, length_prefixed

# Run by the node's interpreter: read a length-prefixed source from stdin and execute it.
# Double quotes only: a shell's single quotes then carry it as it is (job.sbatch).
BOOTSTRAP = (
    "import os\n"
    "def read_exact(n):\n"
    '    data = b""\n'
    "    while len(data) < n:\n"
    "        chunk = os.read(0, n - len(data))\n"
    "        if not chunk:\n"
    '            raise SystemExit("orchestrator agent: the controller went away")\n'
    "        data += chunk\n"
    "    return data\n"
    'exec(compile(read_exact(int(read_exact(8))), "orchestrator-agent", "exec"))\n'
)

# The agent's modules as they run on the node, each after those it imports.
NODE_MODULES = (
    "protocol",
    "shipping",
    "disk",
    "processes",
    "controller",
    "sampling",
    "ranks",
    "py_spy",
    "child_stacks",
    "stacks",
    "limit_warning",
    "flight",
    "hook",
    "runtime",
    "wakeup",
    "programs.route",
    "connects",
    "main",
)

# Under SLURM, the batch script's task on each node runs keeper.py's main (after the rest).
IN_ALLOCATION = (*NODE_MODULES, "replay", "relay", "task_warning", "keeper")

_AGENT_START: bytes | None = None


def agent_argv(python: str, tag: str) -> list[str]:
    """How a node's interpreter starts the agent.

    Isolated (-I: no PYTHON* variables, no user site) and without site (-S): the agent
    needs the standard library alone, and skipping site-packages and their .pth files
    saves CPU on every node at every start (45 -> 38 ms for a whole `exec` step in a
    venv with torch). The job's own processes get the environment as it is.
    """
    return [python, "-I", "-S", "-u", "-c", BOOTSTRAP, "orchestrator-agent", tag]


def agent_start() -> bytes:
    """What the controller writes to a new agent before its first config: the loader (for
    BOOTSTRAP), then the agent's modules compiled here (with this interpreter's magic
    number) and as source; see loader.py."""
    global _AGENT_START
    if _AGENT_START is None:
        package = resources.files(__package__)
        sources = [
            (f"{__package__}.{name}", package.joinpath(f"{name.replace('.', '/')}.py").read_text())
            for name in NODE_MODULES
        ]
        compiled = [(name, compile_module(name, source)) for name, source in sources]
        loader = package.joinpath("loader.py").read_text()
        loader += "\nsys.exit(install(read_modules(read_exact)).main())\n"
        _AGENT_START = b"".join(
            length_prefixed(part)
            for part in (
                loader.encode(),
                MAGIC_NUMBER,
                marshal.dumps(compiled),
                # plain data: marshal's version 4 reads on every Python 3 since 3.4
                marshal.dumps(sources, 4),
            )
        )
    return _AGENT_START


def slurm_bundle(config: dict) -> bytes:
    """What the batch script feeds BOOTSTRAP on every node (slurm.sbatch.j2): the loader,
    the agent's modules with keeper.py last, as source only (the nodes' interpreter may
    not be this one; a node compiles them in some 30 ms), then the step's config."""
    package = resources.files(__package__)
    sources = [
        (f"{__package__}.{name}", package.joinpath(f"{name.replace('.', '/')}.py").read_text())
        for name in IN_ALLOCATION
    ]
    loader = package.joinpath("loader.py").read_text()
    loader += "\nsys.exit(install(read_modules(read_exact)).main())\n"
    parts = (loader.encode(), b"source", marshal.dumps([], 4), marshal.dumps(sources, 4))
    return b"".join(map(length_prefixed, parts)) + encode_config(config)


@cache
def stack_hook_source() -> str:
    """The ranks' stack hook (stack_hook/sitecustomize.py), sent in a job's step config: the
    agent writes it into the node directory and puts it first on the ranks' PYTHONPATH."""
    return resources.files(__package__).joinpath("stack_hook", "sitecustomize.py").read_text()
