"""Numbers of any size, wherever one is read: a value, or the one-line typed error naming
where (file:line, the flag) and the range, never a traceback. Python's int() raises
"Exceeds the limit (4300 digits)" past 4300 digits; every reader goes through
orchestrator/numerals.py, which counts the digits first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import ConfigError, OrchestratorError, SourceError
from orchestrator.hostlist import compress_hosts, expand_range
from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.hosts.selection import select_hosts
from orchestrator.numerals import MAX_SLOTS, NumberError, shown, whole_number
from orchestrator.options.choosing import Selection
from orchestrator.options.declare import whole_from_text
from orchestrator.options.workload import JobOptions
from orchestrator.plan.deadline import limit_seconds, parse_signal
from orchestrator.slurm.control.parse import parse_exit_code, parse_job_id

LONG = "1" * 5000
LONGEST_LINE = 400  # a message is one line a user reads: never the 5000 digits

# Digit strings of every length that matters: short, around the bounds, past 4300 digits.
DIGITS = st.one_of(
    st.text("0123456789", min_size=1, max_size=30),
    st.integers(4290, 6000).map(lambda n: "1" * n),
    st.integers(1, 6000).flatmap(lambda n: st.sampled_from(["0" * n + "7", "9" * n])),
)


def test_whole_number_reads_in_range_and_refuses_the_rest() -> None:
    assert whole_number("8", "slots", 1, MAX_SLOTS) == 8
    assert whole_number(" 007 ", "port", 1, 65535) == 7  # zero padding is not size
    for bad in ("0", "65536", "-1", "+80", "1e3", "²", "٣", "8 8", "", LONG, 10**5000):
        with pytest.raises(NumberError, match=r"^port must be a number from 1 to 65535, got "):
            whole_number(bad, "port", 1, 65535)
    assert whole_number("-5", "n", -10, 10) == -5  # a sign only where the range has one


def test_a_long_value_is_shown_cut_with_its_length() -> None:
    assert shown("abc") == "'abc'"
    assert shown(LONG) == f"'{'1' * 32}'… (5000 characters)"
    assert shown(10**5000) == "a number of about 5001 digits"  # str() itself would raise
    with pytest.raises(NumberError) as caught:
        whole_number(LONG, "slots", 1, MAX_SLOTS)
    assert str(caught.value) == (
        f"slots must be a number from 1 to {MAX_SLOTS}, got '{'1' * 32}'… (5000 characters)"
    )


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (f"n1 slots={LONG}", f"slots must be a number from 1 to {MAX_SLOTS}"),
        (f"n1 max_slots={LONG}", f"max_slots must be a number from 1 to {MAX_SLOTS}"),
        (f"n1:{LONG}", f"slots must be a number from 1 to {MAX_SLOTS}"),
        (f"n1 port={LONG}", "port must be a number from 1 to 65535"),
        (f"n[1-{LONG}]", "a range bound in host 'n[1-111"),
        (f"n[{LONG}-2]", "a range bound in host"),
        (f"n{LONG}", "is too long for a host name (at most 253 characters, 63 between dots)"),
    ],
)
def test_a_hostfile_number_of_5000_digits_names_the_file_and_line(line: str, says: str) -> None:
    with pytest.raises(SourceError) as caught:
        parse_hostfile(f"n0\n{line}\n", "h.txt")
    message = str(caught.value)
    assert message.startswith("h.txt:2: ") and says in message, message
    assert len(message) < LONGEST_LINE and "\n" not in message


def test_a_yaml_hostfile_number_of_5000_digits_names_its_line() -> None:
    for key in ("slots", "max_slots", "port"):
        with pytest.raises(SourceError, match=rf"^h.yaml:2: {key} must be a number from 1 to"):
            parse_hostfile(f"- host: n0\n- host: n1\n  {key}: {LONG}\n", "h.yaml")


def test_include_of_a_5000_digit_slot_names_the_flag() -> None:
    cluster = parse_hostfile("w slots=2\n", "h.txt")
    with pytest.raises(ConfigError) as caught:
        select_hosts(cluster, Selection(include=f"w:{LONG}"))
    message = str(caught.value)
    assert message.startswith("--include 'w:111") and "(5002 characters)" in message
    assert f"is not a slot id (0 to {MAX_SLOTS - 1})" in message
    assert len(message) < LONGEST_LINE


def test_compress_hosts_keeps_a_long_digit_name_whole() -> None:
    name = f"n{LONG}"
    assert compress_hosts([name]) == name
    assert compress_hosts(["n1", name, "n2"]) == f"n[1-2],{name}"


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: JobOptions(master_port=LONG), "--master-port must be a number from 1 to 65535"),
        (lambda: limit_seconds(LONG), "a number in it has more than 18 digits"),
        (lambda: limit_seconds(f"1:{LONG}"), "expected a time limit"),
        (lambda: parse_signal(f"USR1@{LONG}"), "SECONDS from 1 to 65535"),
        (lambda: whole_from_text(LONG), "is not a whole number of at most 18 digits"),
        (lambda: JobOptions(nproc_per_node=10**5000), "of at most 18 digits"),
        (lambda: parse_job_id(LONG), "sbatch printed no job id"),
    ],
)
def test_flags_and_slurm_output_of_5000_digits_are_one_line(call, says: str) -> None:
    with pytest.raises((ConfigError, OrchestratorError, ValueError)) as caught:
        call()
    assert says in str(caught.value) and len(str(caught.value)) < LONGEST_LINE


def test_slurm_exit_codes_past_a_byte_are_not_codes() -> None:
    assert parse_exit_code("3:0") == 3 and parse_exit_code("0:15") == 143
    assert parse_exit_code(f"{LONG}:0") is None and parse_exit_code("256:0") is None


def typed(call) -> None:
    """`call()` gives a value or a typed, one-line error; anything else fails the test."""
    try:
        call()
    except (NumberError, ConfigError, OrchestratorError) as exc:
        assert len(str(exc)) < LONGEST_LINE and "\n" not in str(exc), str(exc)


@settings(max_examples=150, deadline=None)
@given(digits=DIGITS)
def test_any_digit_string_is_a_value_or_the_typed_error_everywhere(digits: str) -> None:
    for line in (
        f"n1 slots={digits}",
        f"n1 max_slots={digits}",
        f"n1:{digits}",
        f"n1 port={digits}",
        f"n[{digits}-{digits}]",  # one host: n[1-<many>] is above, and may be 10**5 of them
        f"n[{digits}]",
        f"n{digits}",
    ):
        typed(lambda line=line: parse_hostfile(line, "h.txt"))
    typed(lambda: parse_hostfile(f"- host: n1\n  port: {digits}\n", "h.yaml"))
    typed(lambda: expand_range(f"n[{digits}-{digits}]", ConfigError))
    typed(lambda: select_hosts(parse_hostfile("w slots=2\n"), Selection(include=f"w:{digits}")))
    typed(lambda: select_hosts(parse_hostfile("w slots=2\n"), Selection(exclude=f"w:{digits}")))
    typed(lambda: JobOptions(master_port=digits))
    typed(lambda: limit_seconds(digits))
    typed(lambda: limit_seconds(f"{digits}-1"))
    typed(lambda: parse_signal(f"USR1@{digits}"))
    typed(lambda: parse_signal(f"{digits}@10"))
    typed(lambda: parse_job_id(digits))
    typed(lambda: whole_from_text(digits))
    parse_exit_code(f"{digits}:{digits}")
    compress_hosts([f"n{digits}", "n1"])  # never raises


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (f"Port {LONG}", "config:3: Port must be a number from 1 to 65535, got '111"),
        ("Port 0", "config:3: Port must be a number from 1 to 65535, got 0"),
        (f"ConnectTimeout {LONG}", "config:3: ConnectTimeout must be from 0 to 31536000 seconds"),
        ("ServerAliveInterval nan", "config:3: ServerAliveInterval must be from 0 to 31536000"),
    ],
)
def test_an_ssh_config_number_out_of_range_names_its_line(tmp_path, line: str, says: str) -> None:
    from orchestrator.backends.ssh.client_config import SshConfig, resolve
    from orchestrator.options.reaching import SshOptions

    config = tmp_path / "config"
    config.write_text(f"# nodes\nHost node1\n    {line}\n")
    with pytest.raises(ConfigError) as caught:
        resolve("node1", SshConfig(str(config)), SshOptions())
    assert str(caught.value).startswith(f"{tmp_path}/") and says in str(caught.value)
    assert len(str(caught.value)) < LONGEST_LINE


@pytest.mark.parametrize(
    ("hostfile", "flags", "says"),
    [
        (f"n1 slots={LONG}\n", (), "h.txt:1: slots must be a number from 1 to 65536"),
        (f"n1 port={LONG}\n", (), "h.txt:1: port must be a number from 1 to 65535"),
        (f"n0\nn[1-{LONG}]\n", (), "h.txt:2: a range bound in host 'n[1-111"),
        ("localhost slots=2\n", ("--include", f"localhost:{LONG}"), "--include 'localhost:111"),
    ],
)
def test_through_the_command_line_exit_2_one_line_no_traceback(
    tmp_path, capsys, monkeypatch, hostfile: str, flags: tuple[str, ...], says: str
) -> None:
    from orchestrator.cli import main

    (tmp_path / "h.txt").write_text(hostfile)
    (tmp_path / "x.py").write_text("print('x')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:  # anything else escaping main is a traceback
        main(["launch", "h.txt", *flags, "--dry-run", "--run-dir", "runs", "--", "x.py"])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert err.startswith(f"orchestrator: error: {says}"), err
    assert err.count("\n") == 1 and len(err) < LONGEST_LINE and "Traceback" not in err
