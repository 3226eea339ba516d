"""The node agent: a package on the controller, one process on each node (see main.py).

protocol.py       frames to the controller, commands and step configs from it
processes.py      the node script in a session of its own, the subreaper, stopping everything
shipping.py       the outbox to the controller, masking, the script's output as whole lines
ranks.py          each rank's output file as whole lines, then its exit
disk.py           whether the node directory can still be written, and if not, why
controller.py     whether the controller's host still answers, when the controller is silent
wakeup.py         what wakes a quiet agent: writes in the node directory, signals, a child's end
sampling.py       node samples for the metrics channel
py_spy.py         reading a rank's stack from outside with py-spy
stacks.py         every rank's Python stacks, by py-spy or the ranks' own hook (stack_hook/)
child_stacks.py   the stacks of a rank's own child processes
hook.py           the ranks' stack hook and torch's flight recorder, installed for a step
flight.py         torch's flight recorder: turned on for the ranks, dumped through the hook
connects.py       the step's TCP connections that get no answer: the store or a peer dropped
limit_warning.py  the time limit's warning on this node, sent on to the ranks
runtime.py        the container runtime on the node: what crosses into a job's container
main.py           the agent: one loop tying them together, step after step
keeper.py         under SLURM: the agent in the allocation, its stream kept for a controller
replay.py         under SLURM: the node's stream, kept for a controller that connects late
relay.py          under SLURM: the keeper's Unix socket, between the agent and one controller
task_warning.py   under SLURM: the task's rules for the warning, and its exit after it
loader.py         runs first on a node: makes the modules above importable (bytecode or source)
bootstrap.py      controller side: the agent's command line and what it is sent first
programs/         programs shipped as source and run on their own: reach.py (the path check),
                  route.py (the interface to an address; the agent sends the node's addresses
                  with it), cores.py (--bind-cores), dial.py (under SLURM: the launcher's
                  way to the agents)
stack_hook/       the ranks' stack hook (sitecustomize.py), sent in a step's config

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
