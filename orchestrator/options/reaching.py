"""The SSH group: how nodes are reached (launch, exec, check, clean; backends/ssh uses it)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from orchestrator.options.declare import OptionGroup, option


def key_file(path: str) -> str:
    """--identity FILE: a file that is there and readable, as an absolute path (a detached
    controller runs elsewhere). ssh goes on without a missing -i file; a key the user named
    is never meant to be skipped, so here it is an error (an ssh config's IdentityFile is
    still skipped when missing, as ssh does: backends/ssh/identities.py)."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError("expected the path of a private key file")
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(full):
        raise ValueError(f"no such file ({full}); give the path of a private key (ssh -i's)")
    if not os.path.isfile(full):
        raise ValueError(f"{full} is not a file; give the path of a private key")
    try:
        with open(full, "rb"):
            pass
    except OSError as exc:
        raise ValueError(f"cannot read {full} ({exc.strerror})") from None
    return full


@dataclass(frozen=True)
class SshOptions(OptionGroup):
    """How to reach nodes over SSH: the --ssh-config, --known-hosts, ... flags."""

    ssh_config: str | None = option(
        None,
        "OpenSSH client config to use instead of ~/.ssh/config and /etc/ssh/ssh_config, like "
        "ssh -F.",
        metavar="FILE",
    )  # None: ~/.ssh/config then /etc/ssh/ssh_config, as ssh
    identity_files: tuple[str, ...] = option(
        (),
        "Private key to try first (repeatable); the ssh-agent and ~/.ssh/id_* are tried too. "
        "A file that does not exist is an error. No short form: -i is --include, as in "
        "DeepSpeed's launcher.",
        name="--identity",
        metavar="FILE",
        repeat=True,
        parse=key_file,
    )
    known_hosts: str | None = option(
        None,
        "Host keys to verify nodes against, instead of the ssh config's UserKnownHostsFile.",
        metavar="FILE",
    )  # None: UserKnownHostsFile of the ssh config
    accept_new_host_keys: bool = option(
        False,
        "Accept and record the host key of a node not yet in known_hosts (a changed key is "
        "still refused), like ssh's StrictHostKeyChecking=accept-new.",
        switch="on",
    )
    connect_timeout: float | None = option(
        None,
        "Give up on a node that does not answer within this time [default: the ssh config's "
        "ConnectTimeout, else 10].",
        metavar="SECONDS",
        kind=float,
        minimum=0.1,
    )  # None: ConnectTimeout, else the default
