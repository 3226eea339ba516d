"""What the runs on a lab cluster leave in the nodes' home, and removing it at teardown.

The nodes log in as root (ssh.py: `User root`), and sshd gives a login the home of the
password database, not the HOME of the lab (which holds only the controller's ssh). So every
run the tests launch on a cluster leaves ~root/.orchestrator/runs/RUN/nodeK behind, on the
machine itself: the failed and stopped runs that the tests make on purpose (crash,
power-loss, skew-plus30, ...) are kept there, as they would be for a user.

A run folder is this cluster's when a node script in it (nodeK.sh, written when the run
starts) names one of its nodes (`olab3-node0`) or an address of its subnet. Cluster names and
subnets are unique among the clusters alive at once (state.allocate), and only scripts
written since `since` count, so another session's runs and the user's own are left alone.
"""

from __future__ import annotations

import ipaddress
import pwd
import re
import shutil
from pathlib import Path

# Where the orchestrator's node side keeps a run (orchestrator/plan/launch_plan.py:
# NODE_RUNS_DIR), under the nodes' login home.
NODE_RUNS = Path(pwd.getpwnam("root").pw_dir) / ".orchestrator" / "runs"
IPV4 = re.compile(r"(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}(?!\d)")


def made_on(
    folder: Path, name: str, subnet: ipaddress.IPv4Network | ipaddress.IPv6Network, since: float
) -> bool:
    """Whether a node script of run `folder`, written since `since`, names a node of the
    cluster `name` or an address in its `subnet`."""
    for script in folder.rglob("*.sh"):
        try:
            if script.stat().st_mtime < since:
                continue
            text = script.read_text(errors="replace")
        except OSError:
            continue
        if re.search(rf"(?<![\w.-]){re.escape(name)}-", text):  # NAME-nodeK (netns.plan_nodes)
            return True
        for found in IPV4.findall(text):
            try:
                if ipaddress.ip_address(found) in subnet:
                    return True
            except ValueError:
                continue
    return False


def remove_runs_of(
    name: str,
    subnet: ipaddress.IPv4Network | ipaddress.IPv6Network,
    since: float,
    runs: Path = NODE_RUNS,
) -> list[str]:
    """Remove the run folders in `runs` that cluster `name` made (`made_on`); their names."""
    try:
        folders = sorted(p for p in runs.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []
    removed = []
    for folder in folders:
        if made_on(folder, name, subnet, since):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed
