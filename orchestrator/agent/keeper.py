"""The node agent inside a SLURM allocation: the same agent, kept for whichever controller comes.

Under SLURM the job belongs to SLURM, not to a controller: the batch script starts, with one
srun task per node, an interpreter that reads this module, the agent's others and a config
from its stdin (`bootstrap.slurm_bundle`) and calls `main`. Here:

- The agent (main.Agent) runs in this process as over SSH, its stdin and stdout on two
  pipes instead of a connection, its step the node's part of the batch script
  (`bash -c orchestrator_node`): it ships the node's ranks' output, metrics and exits and
  samples the node, as over SSH. It never stops for want of a controller (heartbeat
  timeout 0): a job submitted by hand runs alone, and one whose controller died goes on.
- A relay thread keeps every byte the agent writes, numbered by its offset in the node's
  stream, up to KEPT_BYTES (then the oldest whole frames go), and listens on a Unix socket
  on the node (`socket_path`). A controller reaches it through SLURM (one `srun
  --overlap --jobid JOB` step over the nodes, running programs/dial.py on each): it says from
  which offset it wants the stream, gets it from there and then live, and what it sends
  are the agent's commands (`stacks`, `stop`, `end`, `signal`). One controller at a time:
  a new connection replaces the old.
- Without a job folder (a script rendered for `sbatch` by hand), the script's own output
  (frames N) and the agent's messages (M) also go to this task's stdout and stderr, where
  SLURM puts them (slurm-JOB.out), as the script's output went before there was an agent.
- SLURM's warning (the time limit's or a preemption's, which srun passes to every process
  of the step) is held for the ranks still starting when it came: each gets it once it
  catches it (`hold`, limit_warning.HeldWarning).
- Once the agent has finished, what a connected controller has not yet taken is sent to it
  (up to DRAIN_S), and the task ends with the script's exit code, which srun reads; after
  the warning a nonzero one is kept in a file and the task ends 0 (`stopped_on_warning`),
  so that srun's --kill-on-bad-exit spares the nodes whose ranks still save.

The stream kept is replay.py's, the socket relay.py's, the warning's and the exit's rules
task_warning.py's; here is the task that ties them to the agent.

Standard library only: this module runs on the nodes (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import deque

from orchestrator.agent.limit_warning import HeldWarning, catching_now, rank_targets
from orchestrator.agent.main import Agent
from orchestrator.agent.protocol import read_config
from orchestrator.agent.relay import Relay, socket_path
from orchestrator.agent.task_warning import hold, stopped_on_warning, warned_frame

DRAIN_S = 10.0  # after the step: how long a connected controller may take to read the rest
# The batch script hands the bundle to the interpreter from this variable; the step's
# processes do not need a copy of it in their environment.
CODE_ENV = "ORCHESTRATOR_AGENT_CODE"


def node_config(config: dict, environ: dict[str, str]) -> dict:
    """The step's config on this node: the batch script's, with this node's folder (the
    job's, as the script's node part names it) and its ranks (`nproc` a node, in node
    order), the folder srun started the task in (the job's working directory) and no
    controller to wait for. Without a job folder (a script rendered for sbatch by hand)
    the ranks' output goes to SLURM's files only, and no ranks are shipped."""
    job_dir = environ.get("ORCHESTRATOR_JOB_DIR")
    node = int(environ.get("SLURM_NODEID", "0"))
    node_dir, ranks = None, []
    if job_dir:
        restart = environ.get("SLURM_RESTART_COUNT", "0")
        node_dir = f"{job_dir}/attempt{restart}/node{node}"
        nproc = int(config.get("nproc", 0))
        ranks = list(range(node * nproc, (node + 1) * nproc))
    return {
        **config,
        "node_dir": node_dir,
        "ranks": ranks,
        "cwd": os.getcwd(),
        "heartbeat_timeout": 0,
    }


def main() -> int:
    # The time limit's warning (SIGUSR1/2, which SLURM or the batch script sends to every
    # process of the step) is for the ranks: a handler, not "ignore", so that the processes
    # the agent starts get the default back (the node script ignores it itself). Once the
    # relay runs, the handler also tells the launcher (a G frame, warned_frame).
    warned: deque[bytes] = deque()
    came: list[HeldWarning] = []  # the warning, once it came: held for ranks still starting

    def on_warning(number: int, _frame: object) -> None:
        warned.append(warned_frame(number))
        if not came:
            targets = rank_targets(os.getpid())
            came.append(HeldWarning(number, catching_now(targets, number)))

    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, on_warning)
    config = node_config(read_config(), dict(os.environ))
    os.environ.pop(CODE_ENV, None)
    env = os.environ
    path = socket_path(
        env.get("SLURM_JOB_ID", "0"),
        env.get("SLURM_RESTART_COUNT", "0"),
        env.get("SLURM_NODEID", "0"),
    )
    echo = (os.dup(1), os.dup(2))
    commands_r, commands_w = os.pipe()
    frames_r, frames_w = os.pipe()
    os.dup2(commands_r, 0)
    os.dup2(frames_w, 1)
    os.close(commands_r)
    os.close(frames_w)
    # Without a job folder (a script rendered for sbatch by hand) the script's output has
    # no other place to go than SLURM's; with one, the agent ships it to the launcher.
    relay = Relay(path, frames_r, commands_w, None if config["node_dir"] else echo, warned)
    done = threading.Event()
    thread = threading.Thread(target=relay.run, args=(done,), name="relay", daemon=True)
    thread.start()
    agent = Agent(config)
    holder = threading.Thread(target=hold, args=(came, agent, done), name="held", daemon=True)
    holder.start()
    agent.run()
    os.close(1)  # the relay reads the agent's last frame, then the end of its stream
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline and not (relay.agent_done and relay.taken()):
        time.sleep(0.05)
    done.set()
    thread.join(timeout=2)
    relay.close()
    rc = agent.processes.script_rc
    if rc is None:
        return 1
    rc = rc if rc >= 0 else 128 - rc  # a signal's number, as a shell says it
    if rc and (came or agent.warned):
        return stopped_on_warning(path, rc)
    return rc


if __name__ == "__main__":  # pragma: no cover - run on the node through the bundle
    sys.exit(main())
