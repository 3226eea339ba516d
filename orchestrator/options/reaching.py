"""The SSH group: how nodes are reached (launch, exec, check, clean; backends/ssh uses it)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.options.declare import OptionGroup, option


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
        "Private key to try first (repeatable); the ssh-agent and ~/.ssh/id_* are tried too.",
        name="--identity",
        aliases=("-i",),
        metavar="FILE",
        repeat=True,
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
