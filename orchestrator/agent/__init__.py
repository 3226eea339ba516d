"""The node agent: a package on the controller, one process on each node (see main.py).

protocol.py   frames to the controller, commands and step configs from it
processes.py  the node script in a session of its own, the subreaper, stopping everything
shipping.py   the outbox to the controller, masking, the script's output as whole lines
ranks.py      each rank's output file as whole lines, then its exit
disk.py       whether the node directory can still be written, and if not, why
controller.py whether the controller's host still answers, when the controller is silent
wakeup.py     what wakes a quiet agent: writes in the node directory, signals, a child's end
py_spy.py     reading a rank's stack from outside with py-spy
stacks.py     every rank's Python stacks, by py-spy or the ranks' own hook (stack_hook/)
flight.py     torch's flight recorder: turned on for the ranks, dumped through the hook
connects.py   the step's TCP connections that get no answer: the store or a peer dropped
route.py      which interface reaches an address (run inside node scripts, like cores.py;
              the agent sends the node's addresses with it)
cores.py      --bind-cores: disjoint core sets per local rank
main.py       the agent: one loop tying them together, step after step
keeper.py     under SLURM: the agent in the allocation, its stream kept for a controller
loader.py     runs first on a node: makes the modules above importable (bytecode or source)
bootstrap.py  controller side: the agent's command line and what it is sent first

Only what the controller needs is imported here; on a node this package is an empty module
and the modules are installed by loader.py.
"""

from __future__ import annotations

from orchestrator.agent.bootstrap import BOOTSTRAP, agent_argv, agent_start
from orchestrator.agent.protocol import IDLE_S, encode_config, frame, length_prefixed

__all__ = [
    "BOOTSTRAP",
    "IDLE_S",
    "agent_argv",
    "agent_start",
    "encode_config",
    "frame",
    "length_prefixed",
]
