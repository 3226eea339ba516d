"""Room for a controller's descriptors (orchestrator.backends.open_files): the soft limit on open
files rises to what the node count needs, up to the hard limit, and never falls. Run in a
child interpreter: the limit is the process's, and the test must not leave it changed."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import resource, sys
from orchestrator.backends.open_files import BASE_FILES, FILES_PER_NODE, allow_open_files
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
low = 1024 if hard == resource.RLIM_INFINITY else min(1024, hard)
resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
wanted = BASE_FILES + FILES_PER_NODE * 1000
assert allow_open_files(1000) == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
assert now == (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)), (now, hard)
assert allow_open_files(2) == now  # a smaller run never lowers it
cap = 2048 if hard == resource.RLIM_INFINITY else min(2048, hard)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(low, cap), cap))  # lowering is always allowed
assert allow_open_files(1000) == cap  # the hard limit is as far as it goes
print("ok")
"""


def test_the_soft_limit_rises_for_the_nodes_up_to_the_hard_one() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
