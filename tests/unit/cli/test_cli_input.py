"""Bad input through the command line, as a user meets it.

Each case must exit 2 with a message naming the file:line or the flag, and never print a
traceback. The cases of the issue (BAD, and the GOOD ones beside them) run as `python -m
orchestrator ...` processes in tests/local/test_cli_input_local.py; the cases here call the
same entry point, `orchestrator.cli.main`, in this process. `launch --dry-run` gets a
command past parsing; on a localhost hostfile it probes only this machine and starts
nothing, and must leave no run folder behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

HOSTFILES = {
    "local.txt": "# this machine\nlocalhost slots=2\n",
    "empty.txt": "",
    "comments.txt": "# nothing here\n\n   # still nothing\n",
    "empty.yaml": "hosts: []\n",
    "unparsable.txt": "node1 slots=2\nnode2 slots 4\n",
    "slots0.txt": "node1\nnode2 slots=0\n",
    "negative.txt": "node1:-2\n",
    "duplicate.txt": "node1 slots=2\nnode2\nnode1\n",
    "metachar.txt": "node1\nnode$(reboot)\n",
    "backtick.txt": "`reboot`\n",
    "semicolon.yaml": "- host: 'node1;rm'\n",
    "space.yaml": "- host: node1\n- host: 'node 2'\n",
    "tab.txt": "node1\tnode2\n",
    "unknown_key.yaml": "- host: node1\n  slotz: 2\n",
    "unknown_key.txt": "node1 gpus=8\n",
    "bad.yaml": "- host: node1\n  slots: [1\n",
    "two_remote.txt": "node-a slots=2\nnode-b\n",
    "loopback_multi.txt": "localhost\nnode-b\n",
    "max_slots.txt": "node-a max_slots=2\n",
}


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    words: tuple[str, ...]  # all must appear in stderr
    exit_code: int = 2


def launch(hostfile: str, *args: str) -> tuple[str, ...]:
    return ("launch", hostfile, "--dry-run", "--run-dir", "runs", *args)


BAD = {  # run as processes of their own by tests/local/test_cli_input_local.py
    "missing hostfile": Case(launch("nonexistent.txt"), ("nonexistent.txt: hostfile not found",)),
    "empty hostfile": Case(
        launch("empty.txt"), ("empty.txt: no hosts", "no fallback to localhost")
    ),
    "unparsable line": Case(
        launch("unparsable.txt"), ("unparsable.txt:2:", "expected key=value, got 'slots'")
    ),
    "slots=0": Case(
        launch("slots0.txt"), ("slots0.txt:2:", "slots must be a number from 1 to 65536, got 0")
    ),
    "negative slots": Case(
        launch("negative.txt"),
        ("negative.txt:1:", "slots must be a number from 1 to 65536, got -2"),
    ),
    "duplicate host": Case(
        launch("duplicate.txt"),
        ("duplicate.txt:3:", "duplicate host 'node1'", "first at duplicate.txt:1"),
    ),
    "shell metacharacters": Case(
        launch("metachar.txt"), ("metachar.txt:2:", "not a valid host name", "'$'")
    ),
    "whitespace in host": Case(
        launch("space.yaml"), ("space.yaml:2:", "host 'node 2' is not a valid host name", "' '")
    ),
    "unknown yaml key": Case(
        launch("unknown_key.yaml"),
        (
            "unknown_key.yaml:2:",
            "unknown key 'slotz'",
            "valid keys: host, slots, max_slots, user, port, ifname, python",
        ),
    ),
    "--env without =": Case(
        launch("local.txt", "--env", "FOO"), ("--env 'FOO': expected NAME=VALUE",)
    ),
    "missing local script": Case(
        launch("local.txt", "--", "nosuch.py"), ("script 'nosuch.py' not found", "--workdir")
    ),
    "--master-port 0": Case(
        launch("local.txt", "--master-port", "0"), ("--master-port", "got '0'")
    ),
    "--master-port 70000": Case(
        launch("local.txt", "--master-port", "70000"), ("--master-port", "got '70000'")
    ),
    "--master-port abc": Case(
        launch("local.txt", "--master-port", "abc"), ("--master-port", "got 'abc'")
    ),
    "--run-id with slash": Case(launch("local.txt", "--run-id", "a/b"), ("--run-id 'a/b'",)),
    "--workdir with --sync": Case(
        launch("local.txt", "--workdir", ".", "--sync", "."), ("--workdir and --sync",)
    ),
}

MORE_BAD = {  # run in this process through orchestrator.cli.main
    "--min-nodes above the hosts": Case(
        ("render", "two_remote.txt", "-o", "out-mn", "--min-nodes", "3", "--", "train.py"),
        ("--min-nodes 3", "the 2 node(s) the run starts on", "two_remote.txt"),
    ),
    "--min-nodes above the hosts left by --spares": Case(
        ("render", "two_remote.txt", "-o", "out-mn", "--spares", "1", "--min-nodes", "2"),
        ("--min-nodes 2", "the 1 node(s)", "after --spares 1"),
    ),
    "--min-nodes 0": Case(
        launch("local.txt", "--min-nodes", "0"), ("--min-nodes must be a positive integer",)
    ),
    "negative --max-restarts": Case(
        launch("local.txt", "--max-restarts", "-1"), ("--max-restarts must be 0 or more, got -1",)
    ),
    "render: --max_restarts not a number": Case(
        ("render", "local.txt", "-o", "out-mr", "--max_restarts", "many"),
        ("--max-restarts", "'many'"),
    ),
    "hostfile is a directory": Case(launch("subdir"), ("subdir: is a directory",)),
    "comments-only hostfile": Case(
        launch("comments.txt"), ("comments.txt: no hosts", "no fallback to localhost")
    ),
    "empty yaml hostfile": Case(launch("empty.yaml"), ("empty.yaml: no hosts",)),
    "backticks": Case(launch("backtick.txt"), ("backtick.txt:1:", "'`'")),
    "semicolon in yaml host": Case(launch("semicolon.yaml"), ("semicolon.yaml:1:", "';'")),
    "tab between hosts": Case(launch("tab.txt"), ("tab.txt:1:", "expected key=value")),
    "unknown text key": Case(
        launch("unknown_key.txt"),
        (
            "unknown_key.txt:1:",
            "unknown key 'gpus'",
            "valid keys: ifname, max_slots, port, python, slots, user",
        ),
    ),
    "invalid yaml": Case(launch("bad.yaml"), ("bad.yaml:", "invalid YAML")),
    "--env bad name": Case(launch("local.txt", "--env", "1X=2"), ("--env '1X=2'",)),
    "--env reserved": Case(
        launch("local.txt", "--env", "WORLD_SIZE=8"), ("WORLD_SIZE is set by the orchestrator",)
    ),
    "--env-file missing": Case(
        launch("local.txt", "--env-file", "none.env"), ("none.env: env file not found",)
    ),
    "--env-file bad line": Case(
        launch("local.txt", "--env-file", "bad.env"), ("bad.env:2:", "expected NAME=VALUE")
    ),
    "-m without module": Case(launch("local.txt", "--", "-m"), ("'-m' needs a module name",)),
    "--master-port unicode digit": Case(
        launch("local.txt", "--master-port", "²"), ("--master-port",)
    ),
    "--nproc-per-node 0": Case(
        launch("local.txt", "--nproc-per-node", "0"),
        ("--nproc-per-node must be a positive integer",),
    ),
    "--nproc-per-node abc": Case(
        launch("local.txt", "--nproc-per-node", "abc"), ("--nproc-per-node", "abc")
    ),
    "--run-id dot-dot": Case(launch("local.txt", "--run-id", ".."), ("--run-id '..'",)),
    "--run-id with space": Case(launch("local.txt", "--run-id", "a b"), ("--run-id 'a b'",)),
    "--run-id with newline": Case(launch("local.txt", "--run-id", "ab\n"), ("--run-id",)),
    "--sync not a directory": Case(
        launch("local.txt", "--sync", "local.txt"), ("--sync", "not a directory")
    ),
    "render: bad hostfile": Case(
        ("render", "unparsable.txt", "-o", "out-bad"), ("unparsable.txt:2:",)
    ),
    "render: loopback master in 2 nodes": Case(
        ("render", "loopback_multi.txt", "-o", "out-loop"), ("loopback", "--master-addr")
    ),
    "render: max_slots": Case(
        ("render", "max_slots.txt", "-o", "out-max", "--nproc-per-node", "4"),
        ("max_slots.txt:1:", "max_slots=2"),
    ),
    "render: --run-id": Case(
        ("render", "local.txt", "-o", "out-id", "--run-id", "x;y"), ("--run-id 'x;y'",)
    ),
    "exec: empty hostfile": Case(("exec", "empty.txt", "--", "true"), ("empty.txt: no hosts",)),
    "logs: unknown run": Case(("logs", "nosuchrun", "--run-dir", "runs"), ("no run 'nosuchrun'",)),
    "status: bad run id": Case(("status", "../etc", "--run-dir", "runs"), ("no run '../etc'",)),
    "render: -o is a file": Case(
        ("render", "local.txt", "-o", "local.txt"), ("-o 'local.txt'", "not a folder")
    ),
    "render: -o under a file": Case(
        ("render", "local.txt", "-o", "local.txt/out"),
        ("-o 'local.txt/out'", "cannot create this folder"),
    ),
    "render: -o cannot be created": Case(
        ("render", "local.txt", "-o", "/proc/nope"),
        ("-o '/proc/nope'", "cannot create this folder"),
    ),
    "render: missing local script": Case(
        ("render", "local.txt", "-o", "out-noscript", "--", "nosuch.py"),
        ("script 'nosuch.py' not found", "--workdir"),
    ),
    "launch: empty --ifname": Case(
        launch("local.txt", "--ifname", ""), ("--ifname must not be empty",)
    ),
    "launch: empty --python": Case(
        launch("local.txt", "--python", " "), ("--python must not be empty",)
    ),
    "render: empty --ifname": Case(
        ("render", "two_remote.txt", "-o", "out-noif", "--ifname", ""),
        ("--ifname must not be empty",),
    ),
    "--time-limit with a bare number": Case(
        launch("local.txt", "--time-limit", "150"),
        ("--time-limit '150'", "--time 2:30 for 150 s or --time 150 for 150 minutes"),
    ),
    "render: --time-limit with a bare number": Case(
        ("render", "local.txt", "-o", "out-tl", "--time-limit=45"),
        ("--time-limit '45'", "--time 0:45 for 45 s"),
    ),
    "--time and --time-limit": Case(
        launch("local.txt", "--time-limit", "2:30", "--time", "5"), ("not both",)
    ),
    "exec: empty --python": Case(
        ("exec", "local.txt", "--python", "", "--", "true"), ("--python must not be empty",)
    ),
}

GOOD = {  # likewise
    "dry run": Case(
        launch(
            "local.txt",
            *("--no-forward-env", "--run-id", "dry1", "--time", "4:00:00"),
            *("--", "-m", "mypkg.train"),
        ),
        (),
        exit_code=0,
    ),
    "render one node": Case(
        (
            "render",
            "local.txt",
            "-o",
            "out-local",
            "--run-id",
            "r-local",
            "--no-forward-env",
            "--",
            "train.py",
            "--epochs",
            "3",
        ),
        (),
        exit_code=0,
    ),
    "render two nodes": Case(
        (
            "render",
            "two_remote.txt",
            "-o",
            "out dir",
            "--run-id",
            "r2",
            "--workdir",
            "/srv/my project",
            "--env",
            "MSG=a b $c",
            "--env",
            "API_TOKEN=tok-hidden-42",
            "--",
            "-m",
            "pkg.main",
        ),
        (),
        exit_code=0,
    ),
}


def prepare_inputs(directory: Path) -> None:
    for name, text in HOSTFILES.items():
        (directory / name).write_text(text, encoding="utf-8")
    (directory / "subdir").mkdir()
    (directory / "bad.env").write_text("A=1\nNOVALUE\n", encoding="utf-8")
    (directory / "train.py").write_text("print('train')\n", encoding="utf-8")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("cli")
    prepare_inputs(directory)
    return directory


def check_refused(case: Case, code: int, stdout: str, stderr: str, workdir: Path) -> None:
    output = stdout + stderr
    assert code == case.exit_code, output
    assert "Traceback" not in output
    for word in case.words:
        assert word in stderr, stderr
    assert stderr.startswith(("orchestrator: error: ", "Usage: ", "Error: ")), output
    assert "{line}" not in stderr and "{path}" not in stderr  # no unformatted placeholder
    assert not (workdir / "runs").exists(), "a bad launch created a run folder"


@pytest.mark.parametrize("name", list(MORE_BAD))
def test_more_bad_input_through_main(workdir: Path, capsys, monkeypatch, name: str) -> None:
    from orchestrator.cli import main

    monkeypatch.chdir(workdir)
    monkeypatch.setenv("NO_COLOR", "1")
    with pytest.raises(SystemExit) as info:  # anything else escaping main is a traceback
        main(list(MORE_BAD[name].argv))
    captured = capsys.readouterr()
    check_refused(MORE_BAD[name], info.value.code, captured.out, captured.err, workdir)


def test_render_of_a_missing_local_script_writes_nothing(
    workdir: Path, capsys, monkeypatch
) -> None:
    from orchestrator.cli import main

    monkeypatch.chdir(workdir)
    with pytest.raises(SystemExit) as info:
        main(["render", "local.txt", "-o", "out-missing", "--", "missing.py"])
    assert info.value.code == 2
    assert "script 'missing.py' not found" in capsys.readouterr().err
    assert not (workdir / "out-missing").exists()


CHECK_REFUSED = {  # check's flags, refused before any node is contacted
    "--json in a missing folder": (
        ("--json", "nodir/report.json"),
        ("--json nodir/report.json", "does not exist"),
    ),
    "--json under a file": (
        ("--json", "local.txt/report.json"),
        ("--json local.txt/report.json", "is not a folder"),
    ),
    "--max-size above 4G": (("--max-size", "5G"), ("--max-size '5G'", "at most 4G")),
    "--max-size one K above 4G": (("--max-size", "4194305K"), ("--max-size", "at most 4G")),
    "empty --ifname": (("--ifname", ""), ("--ifname must not be empty",)),
    "empty --python": (("--python", ""), ("--python must not be empty",)),
}


class NodesContacted(Exception):
    """Raised by the stand-in for check's first contact with the nodes."""


@pytest.fixture
def no_contact(monkeypatch):
    import orchestrator.check.run

    def contact(*args, **kwargs):
        raise NodesContacted

    monkeypatch.setattr(orchestrator.check.run, "connect_each", contact)


@pytest.mark.parametrize("name", list(CHECK_REFUSED))
def test_check_refuses_bad_flags_before_contacting_any_node(
    workdir: Path, capsys, monkeypatch, no_contact, name: str
) -> None:
    from orchestrator.cli import main

    args, words = CHECK_REFUSED[name]
    monkeypatch.chdir(workdir)
    with pytest.raises(SystemExit) as info:  # NodesContacted escaping: checked too late
        main(["check", "two_remote.txt", "--run-dir", "runs", *args])
    check_refused(Case(("check",), words), info.value.code, *capsys.readouterr(), workdir)


def test_check_takes_4g_and_a_writable_json_path(workdir: Path, monkeypatch, no_contact) -> None:
    from orchestrator.cli import main

    monkeypatch.chdir(workdir)
    with pytest.raises(NodesContacted):  # got past every flag to the nodes
        main(
            [
                "check",
                "two_remote.txt",
                "--run-dir",
                "runs",
                "--max-size",
                "4G",
                "--json",
                "report.json",
            ]
        )
    assert not (workdir / "report.json").exists()


def test_one_failed_node_reads_as_its_own_line_several_are_grouped() -> None:
    from orchestrator.errors import NodeError, NodeErrors

    one = NodeErrors([NodeError("node1", "connection refused", exit_code=2)], "connecting")
    assert str(one) == "node1: connection refused" and one.exit_code == 2
    assert len(one.errors) == 1
    two = NodeErrors([NodeError("node1", "refused"), NodeError("node2", "no answer")], "connecting")
    assert str(two) == "connecting failed on 2 node(s):\n  node1: refused\n  node2: no answer"
    assert two.exit_code == 1
    behind = [NodeError(f"ceon{n}", "jump host login: connection refused") for n in range(1, 213)]
    folded = NodeErrors([*behind, NodeError("ceon300", "no answer")], "connecting")
    assert str(folded).splitlines() == [
        "connecting failed on 213 node(s):",
        "  ceon[1-212] (212 nodes): jump host login: connection refused",
        "  ceon300: no answer",
    ]


@pytest.mark.parametrize(
    ("flags", "limit"),
    [
        (("--time", "150"), "9000 s"),
        (("--time-limit", "2:30"), "150 s"),
        (("--time", "2:30"), "150 s"),
    ],
)
def test_time_limit_is_time_but_for_a_bare_number(
    workdir: Path, capsys, monkeypatch, flags: tuple[str, str], limit: str
) -> None:
    from orchestrator.cli import main

    monkeypatch.chdir(workdir)
    with pytest.raises(SystemExit) as info:
        main([*launch("local.txt", "--no-forward-env", *flags), "--", "train.py"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert f"\n# time limit {limit}; SIGUSR1 to every rank" in out


def test_a_bare_time_limit_is_refused_in_one_line(workdir: Path, capsys, monkeypatch) -> None:
    from orchestrator.cli import main

    monkeypatch.chdir(workdir)
    with pytest.raises(SystemExit) as info:
        main(list(launch("local.txt", "--time-limit", "150")))
    assert info.value.code == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
