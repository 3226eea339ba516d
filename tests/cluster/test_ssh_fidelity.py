"""The orchestrator reaches every node that `ssh NODE` reaches, with the same trust decision.

For each scenario (tests/ssh_scenarios.py) the same HOME is written twice, one copy per
tool (both record host keys), and mounted on root's home directory in a private mount
namespace: OpenSSH takes `~` from the password database, not from $HOME. Then, per host,
real `ssh -o BatchMode=yes HOST true` and `orchestrator exec HOSTFILE -- true` must agree:
both connect, or both refuse for the same reason. `ssh -G HOST` is the oracle for the
resolved user, port, host name, identity files and known_hosts files.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.backends.ssh.known_hosts import parse
from orchestrator.hostlist import expand_range
from tests.lab.cluster import Cluster
from tests.lab.fixtures import require_lab
from tests.lab.ssh import KeyPair, new_key, sign_host_key, sign_user_key, wrong_host_key
from tests.ssh_scenarios import JUMP_PORT, SCENARIOS, Fleet, Home, Scenario

pytestmark = pytest.mark.cluster

# Runs as `sh -c IN_HOME HOME KEEP ARGV...`: KEEP is a list of /root entries this Python
# needs (e.g. .pyenv), bound into HOME first so that they stay visible.
IN_HOME = (
    'for d in $1; do mkdir -p "$0/$d" && mount --bind "/root/$d" "$0/$d" || exit 97; '
    'done; mount --rbind "$0" /root && cd /root && shift && exec "$@"'
)
RESOLVE = """
import json, sys
from orchestrator.options.reaching import SshOptions
from orchestrator.backends.ssh.client_config import SshConfig, resolve
config = SshConfig()
print(json.dumps({name: (lambda t: {
    "user": t.user, "hostname": t.hostname, "port": str(t.port),
    "identityfile": list(t.identity_files), "userknownhostsfile": list(t.trust.user_files),
    "proxyjump": t.proxy_jump,
    "certificatefile": list(t.certificate_files)})(resolve(name, config, SshOptions()))
    for name in sys.argv[1:]}))
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require_lab()
    users = tmp_path_factory.mktemp("user-ca")
    new_key().write(users / "user_ca", comment="lab user CA")
    cluster = Cluster.create(
        3, sshd_extra=f"Port {JUMP_PORT}\nTrustedUserCAKeys {users / 'user_ca.pub'}"
    )
    try:
        ca = new_key()
        ca_path = cluster.workdir / "host_ca"
        ca.write(ca_path, comment="lab host CA")
        principals = (
            [cluster.nodes[0].name, cluster.nodes[0].address],
            ["elsewhere.example"],
            [cluster.nodes[2].name],
        )
        validity = ("always:forever", "always:forever", "20200101:20200102")
        for node, names, window in zip(cluster.nodes, principals, validity, strict=True):
            public = cluster.host_key_path(node).with_name("ssh_host_ed25519_key.pub")
            cluster.present_host_certificate(
                node, sign_host_key(ca_path, public, names, validity=window)
            )
        wrong = tuple(wrong_host_key() for _ in cluster.nodes)
        holder = new_key()
        yield Fleet(
            cluster,
            cluster.ssh.identity,
            new_key(),
            ca.public,
            wrong,
            holder,
            user_certificates(users, holder, cluster.ssh.identity),
        )
    finally:
        cluster.teardown()


def user_certificates(users: Path, holder: KeyPair, client: KeyPair) -> dict[str, str]:
    """Certificates by the user CA in `users`: see Fleet.user_certs."""
    holder.write(users / "holder")
    (users / "client.pub").write_text(client.public + "\n")
    ca, expired = users / "user_ca", "20200101:20200102"
    return {
        "good": sign_user_key(ca, users / "holder.pub", ["root"]),
        "expired": sign_user_key(ca, users / "holder.pub", ["root"], validity=expired),
        "alice": sign_user_key(ca, users / "holder.pub", ["alice"]),
        "client_expired": sign_user_key(ca, users / "client.pub", ["root"], validity=expired),
    }


def _kept_under_root() -> str:
    """The entries of /root that this Python and this checkout live in."""
    kept = set()
    for path in (
        os.path.realpath(sys.executable),
        sys.prefix,
        sys.base_prefix,
        str(Path(__file__).resolve().parents[2]),
    ):
        parts = Path(os.path.realpath(path)).parts
        if parts[:2] == ("/", "root") and len(parts) > 2:
            kept.add(parts[2])
    return " ".join(sorted(kept))


def in_home(
    home: Path, *argv: str, timeout: float = 60, agent: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `argv` with `home` as root's home directory (for ssh) and as $HOME (for us),
    with the ssh-agent at `agent` if given (else none)."""
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env.update(HOME="/root", USER="root", LOGNAME="root")
    if agent is not None:
        env["SSH_AUTH_SOCK"] = str(agent)
    return subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            IN_HOME,
            str(home),
            _kept_under_root(),
            *argv,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def make_home(fleet: Fleet, scenario: Scenario, root: Path) -> Home:
    home = Home(root)
    (root / ".ssh").mkdir(parents=True, mode=0o700)
    (root / "keys").mkdir(mode=0o700)
    fleet.client.write(root / "keys" / "cluster")
    fleet.stranger.write(root / "keys" / "other")
    fleet.holder.write(root / "keys" / "holder")
    scenario.build(fleet, home)
    (root / "hosts.txt").write_text("".join(f"{h}\n" for h in scenario.hosts(fleet)))
    return home


@contextlib.contextmanager
def ssh_agent(directory: Path, keys: list[Path]) -> Iterator[Path | None]:
    """A real ssh-agent holding `keys` (none started when there are none)."""
    if not keys:
        yield None
        return
    socket = directory / "agent.sock"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(socket)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while not socket.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        env = {**os.environ, "SSH_AUTH_SOCK": str(socket)}
        subprocess.run(["ssh-add", "-q", *map(str, keys)], env=env, check=True, capture_output=True)
        yield socket
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def ssh_reason(done: subprocess.CompletedProcess[str]) -> str | None:
    err = done.stderr
    if done.returncode == 0:
        return None
    if "REVOKED" in err:
        return "revoked"
    if "HAS CHANGED" in err or "differs from the key for the IP" in err:
        return "changed"
    if "Host key verification failed" in err:
        return "unknown"
    if "Permission denied" in err:
        return "auth"
    if re.search(r"Connection refused|timed out|No route to host|Could not resolve", err):
        return "unreachable"
    return f"other: {err.strip()[-300:]}"


def our_reasons(hosts: list[str], done: subprocess.CompletedProcess[str]) -> list[str | None]:
    """Per host: None when it connected (no error names it), else the refusal reason."""
    said: dict[str, str] = {}  # nodes that failed alike share a line: `gpu[1-2] (2 nodes): ...`
    for line in done.stderr.splitlines():
        found = re.match(r"(?:orchestrator: error: |\s*)(\S+?)(?: \(\d+ nodes\))?: (.*)$", line)
        if found is not None:
            for named in re.split(r",(?![^\[]*\])", found.group(1)):
                for host in expand_range(named) if "[" in named else [named]:
                    said.setdefault(host, found.group(2))
    reasons: list[str | None] = []
    for host in hosts:
        text = said.get(host)
        if text is None:
            reasons.append(None)
            continue
        for reason, pattern in (
            ("unknown", r"host key of \S+ is not in"),
            ("changed", r"host key of \S+ has CHANGED"),
            ("revoked", r"host key of \S+ is REVOKED"),
            ("auth", r"authentication failed"),
            (
                "unreachable",
                r"connection refused|no answer from|"
                r"cannot connect to|cannot resolve",
            ),
        ):
            if re.search(pattern, text):
                reasons.append(reason)
                break
        else:
            reasons.append(f"other: {text}")
    if done.returncode != 0 and all(reason is None for reason in reasons):
        return [f"other: {done.stderr[-300:]}"] * len(hosts)
    return reasons


def ssh_g(home: Path, host: str) -> dict[str, list[str]]:
    done = in_home(home, "ssh", "-G", host)
    assert done.returncode == 0, done.stderr
    values: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        values.setdefault(key, []).append(value)
    return values


def home_path(value: str) -> str:
    return "/root" + value[1:] if value.startswith("~") else value


def recorded_names(path: Path, names: list[str]) -> dict[str, list[str]]:
    """Which of `names` each key of the file is listed under (hashed or not)."""
    keys = parse(path.read_text(), str(path)) if path.exists() else []
    return {name: sorted(k.blob.hex()[-16:] for k in keys if k.matches(name)) for name in names}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_orchestrator_and_ssh_agree(fleet: Fleet, scenario: Scenario, tmp_path: Path) -> None:
    hosts = scenario.hosts(fleet)
    theirs = make_home(fleet, scenario, tmp_path / "ssh-home")
    ours = make_home(fleet, scenario, tmp_path / "our-home")

    resolved = json.loads(in_home(ours.root, sys.executable, "-c", RESOLVE, *hosts).stdout)
    for host in hosts:
        oracle = ssh_g(theirs.root, host)
        mine = resolved[host]
        for key in ("user", "hostname", "port"):
            assert mine[key] == oracle[key][0], (host, key, mine, oracle[key])
        assert mine["userknownhostsfile"] == [
            home_path(p) for p in oracle["userknownhostsfile"][0].split()
        ], (host, mine)
        if mine["identityfile"]:
            assert mine["identityfile"] == [home_path(p) for p in oracle["identityfile"]]
        assert (mine["proxyjump"] or None) == (oracle.get("proxyjump", [None])[0]), host
        assert mine["certificatefile"] == [
            home_path(p).replace("%r", mine["user"]).replace("%h", mine["hostname"])
            for p in oracle.get("certificatefile", [])
        ], (host, mine)

    with ssh_agent(tmp_path, [theirs.root / key for key in scenario.agent]) as agent:
        ssh_runs = [
            in_home(
                theirs.root,
                "ssh",
                "-o",
                "BatchMode=yes",
                *scenario.ssh_args,
                host,
                "true",
                agent=agent,
            )
            for host in hosts
        ]
        exec_run = in_home(
            ours.root,
            sys.executable,
            "-m",
            "orchestrator",
            "exec",
            "hosts.txt",
            "--color",
            "never",
            *scenario.our_args,
            "--",
            "true",
            timeout=120,
            agent=agent,
        )
    expected = [ssh_reason(done) for done in ssh_runs]
    got = our_reasons(hosts, exec_run)
    detail = "\n".join(
        f"{h}: ssh {e!r}, orchestrator {g!r}" for h, e, g in zip(hosts, expected, got, strict=True)
    )
    detail += "\n" + exec_run.stderr + "\n" + "\n".join(done.stderr for done in ssh_runs)
    assert got == expected, detail
    assert tuple(expected) == scenario.expect, "the scenario must test what it says\n" + detail
    for said in (exec_run.stdout, exec_run.stderr):  # no library output, ever
        assert "Traceback" not in said and "Exception (client)" not in said, said
    if all(reason is None for reason in got):
        assert exec_run.returncode == 0, exec_run.stdout + exec_run.stderr
        for host in hosts:
            assert re.search(rf"^{re.escape(host)}\s+ok$", exec_run.stdout, re.M), host

    warning = re.search(r"^warning: host keys NOT verified .*: (.*)$", exec_run.stderr, re.M)
    named = sorted(warning.group(1).split(", ")) if warning else []
    assert named == sorted(hosts[i] for i in scenario.unverified), exec_run.stderr
    assert len(re.findall("NOT verified", exec_run.stderr)) <= 1

    names = [n.name for n in fleet.n] + [n.address for n in fleet.n]
    names += [f"[{n.address}]:{JUMP_PORT}" for n in fleet.n]
    for relative in scenario.recorded:
        ssh_file, our_file = theirs.root / relative, ours.root / relative
        assert recorded_names(our_file, names) == recorded_names(ssh_file, names), relative
        hashed = [line.startswith("|1|") for line in ssh_file.read_text().splitlines()]
        assert [line.startswith("|1|") for line in our_file.read_text().splitlines()] == hashed, (
            ssh_file.read_text(),
            our_file.read_text(),
        )


def test_mount_trick_gives_ssh_the_scenario_home(fleet: Fleet) -> None:
    with tempfile.TemporaryDirectory() as root:
        Path(root, "marker").write_text("here\n")
        done = in_home(Path(root), "sh", "-c", "cat ~/marker; echo $HOME")
    assert done.stdout.split() == ["here", "/root"], done.stderr
    assert not Path("/root/marker").exists(), "the mount must stay inside its namespace"


def test_launch_and_check_through_a_config_only_ssh_understands(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The issue's cluster: nodes reachable only by alias, user, key and known_hosts file
    that ~/.ssh/config names (nothing in ~/.ssh/known_hosts, no default key)."""
    root = tmp_path / "home"
    (root / ".ssh").mkdir(parents=True, mode=0o700)
    (root / "keys").mkdir(mode=0o700)
    fleet.client.write(root / "keys" / "cluster")
    home = Home(root)
    home.write(".ssh/config", "Include ~/.ssh/config.d/*\n")
    home.write(
        ".ssh/config.d/cluster",
        "".join(f"Host gpu{n.index}\n    HostName {n.name}\n" for n in fleet.n[:2])
        + (
            "Host gpu*\n    User root\n    IdentityFile ~/keys/cluster\n"
            "    UserKnownHostsFile ~/keys/cluster_known_hosts\n    StrictHostKeyChecking yes\n"
        ),
    )
    home.write(
        "keys/cluster_known_hosts", "".join(f"{n.name} {n.host_public_key}\n" for n in fleet.n[:2])
    )
    home.hash("keys/cluster_known_hosts")
    (root / "hosts.txt").write_text("gpu0 slots=1\ngpu1 slots=1\n")
    script = tmp_path / "hello.py"  # outside the mounted home: the nodes see the real /root
    script.write_text(
        "import os\nprint('hello from', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n"
    )
    assert in_home(root, "ssh", "-o", "BatchMode=yes", "gpu1", "true").returncode == 0

    launched = in_home(
        root,
        sys.executable,
        "-m",
        "orchestrator",
        "launch",
        "hosts.txt",
        "--run-id",
        "viaconfig",
        "--color",
        "never",
        "--",
        str(script),
        timeout=300,
    )
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "[gpu0 r0] hello from 0 of 2" in launched.stdout, launched.stdout
    assert "[gpu1 r1] hello from 1 of 2" in launched.stdout, launched.stdout
    checked = in_home(
        root,
        sys.executable,
        "-m",
        "orchestrator",
        "check",
        "hosts.txt",
        "--skip-bandwidth",
        "--run-id",
        "checkviaconfig",
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "RESULT: passed (2 node(s), 2 rank(s), gloo)" in checked.stdout, checked.stdout
    assert "warning" not in launched.stderr + checked.stderr
