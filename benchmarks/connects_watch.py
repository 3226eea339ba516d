"""What the agent's watch on unanswered connections (orchestrator/agent/connects.py) costs a
node a look, on this machine's kernel: the look as it runs (the count of resent SYNs first,
the socket table only when it grew or a remote is followed) against reading the socket table
at every look. CPU time (user + system) per look, median of 5 rounds of --looks looks.
Needs no lab: the tables are this machine's own network namespace's."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.agent import connects  # noqa: E402
from orchestrator.agent.connects import ConnectWatch  # noqa: E402


def per_look(watch: ConnectWatch, looks: int) -> float:
    start = time.process_time()
    for i in range(looks):
        watch.look(lambda: [os.getpid()], float(i))
    return (time.process_time() - start) / looks


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--looks", type=int, default=500, help="looks per round (500)")
    looks = cli.parse_args().looks
    gated, every = [], []
    for _ in range(5):
        gated.append(per_look(ConnectWatch(), looks))
        connects.COUNTERS = "/nonexistent"  # no count: the table at every look
        every.append(per_look(ConnectWatch(), looks))
        connects.COUNTERS = "/proc/net/netstat"
    sockets = sum(len(Path(t).read_text().splitlines()) - 1 for t in connects.TABLES)
    print(f"{os.cpu_count()} cores, {sockets} TCP sockets in this namespace's tables")
    print(f"a look as it runs:            {statistics.median(gated) * 1e3:.2f} ms of CPU")
    print(f"the socket table every look:  {statistics.median(every) * 1e3:.2f} ms of CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
