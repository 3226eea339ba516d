"""The SSH backend: reach every node that `ssh NODE` reaches, with the same trust decision.

client_config.py (what `ssh -G` would resolve), known_hosts.py and certs.py (the files and
certificates), trust.py (the host key decision), identities.py (the keys offered for login),
connect.py (paramiko connections), agent_channel.py (the exec channel an agent runs on),
transport.py (how paramiko's transport is run), jumps.py (jump hosts shared by the nodes
behind them), retry.py (handshakes tried again), sftp.py (--sync copies), fanout.py (many
at once).

notices.py  warnings of the SSH layer: each distinct line printed once per command, on stderr
"""

from __future__ import annotations

from orchestrator.backends.ssh.connect import SshConnection, SshSession, connect
from orchestrator.backends.ssh.fanout import connect_all, connect_each

__all__ = ["SshConnection", "SshSession", "connect", "connect_all", "connect_each"]
