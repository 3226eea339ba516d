"""The job spec: program, --master-port, --env / --env-file, forwarded env, validation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import ConfigError, SourceError
from orchestrator.options.workload import JobOptions
from orchestrator.plan.spec import (
    BUNDLED_TRAINER,
    JobSpec,
    Program,
    forwarded_env,
    load_env_file,
    merge_env,
    parse_env_assignments,
)


def parse_master_port(value):
    """--master-port as its group reads it (None: auto)."""
    return JobOptions(master_port=value).master_port


def spec(**changes) -> JobSpec:
    values = {"program": Program.from_argv([]), "python": "/usr/bin/python3", "workdir": "/w"}
    return JobSpec(**{**values, **changes})


# --- Program -----------------------------------------------------------------------------


def test_program_defaults_to_the_bundled_trainer() -> None:
    program = Program.from_argv([])
    assert program.is_bundled_trainer and program.is_module
    assert program.argv() == ("-m", BUNDLED_TRAINER)
    assert "bundled trainer" in program.describe()


def test_program_module_and_script() -> None:
    module = Program.from_argv(["-m", "pkg.train", "--lr", "0.1"])
    assert (module.target, module.args, module.is_module) == ("pkg.train", ("--lr", "0.1"), True)
    assert module.argv() == ("-m", "pkg.train", "--lr", "0.1")
    assert not module.is_bundled_trainer
    script = Program.from_argv(["train.py", "-m", "x"])
    assert script.argv() == ("train.py", "-m", "x") and not script.is_module
    assert script.describe() == "train.py -m x"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-m"], "'-m' needs a module name"),
        (["--lr", "1"], "put orchestrator options before '--'"),
    ],
)
def test_program_errors(argv: list[str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        Program.from_argv(argv)


# --- --master-port -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "port"),
    [
        (None, None),
        ("auto", None),
        (" AUTO ", None),
        ("1", 1),
        ("29500", 29500),
        (" 65535 ", 65535),
        (8080, 8080),
    ],
)
def test_master_port_accepts(value, port) -> None:
    assert parse_master_port(value) == port


@pytest.mark.parametrize(
    "value", ["0", "70000", "65536", "abc", "", "-1", "+80", "1e3", "²", "٣", "29 500", 0]
)
def test_master_port_refuses(value) -> None:
    with pytest.raises(ConfigError, match="--master-port must be a number from 1 to 65535"):
        parse_master_port(value)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=8) | st.integers(-10, 100_000))
def test_master_port_is_an_int_in_range_or_a_config_error(value) -> None:
    try:
        port = parse_master_port(value)
    except ConfigError:
        return
    assert port is None or (isinstance(port, int) and 1 <= port <= 65535)


def test_the_job_group_validates_nproc_and_port() -> None:
    with pytest.raises(ConfigError, match="--nproc-per-node must be a positive integer"):
        JobOptions(nproc_per_node=0)
    with pytest.raises(ConfigError, match="--master-port must be a number from 1 to 65535"):
        JobOptions(master_port=70000)
    assert JobOptions(nproc_per_node=2, master_port=1).nproc_per_node == 2


def test_jobspec_is_frozen() -> None:
    job = spec()
    with pytest.raises(AttributeError):
        job.python = "/x"  # type: ignore[misc]


def test_secret_names_by_pattern_and_by_flag() -> None:
    job = spec(secret_names=frozenset({"DB_URL"}))
    assert job.is_secret("DB_URL") and job.is_secret("HF_TOKEN")
    assert job.is_secret("my_api_key") and job.is_secret("AWS_SECRET_ACCESS_KEY")
    assert job.is_secret("WANDB_APIKEY") and job.is_secret("MYSQL_PASSWORD")
    assert not job.is_secret("NCCL_DEBUG") and not job.is_secret("DB_HOST")


# --- --env -------------------------------------------------------------------------------


def test_env_assignments() -> None:
    assert parse_env_assignments(["A=1", "B=", "C=x=y", "D= spaced "]) == [
        ("A", "1"),
        ("B", ""),
        ("C", "x=y"),
        ("D", " spaced "),
    ]


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("FOO", "--env 'FOO': expected NAME=VALUE, e.g. --env FOO=1"),
        ("=1", "is not a valid variable name"),
        ("1A=1", "'1A' is not a valid variable name"),
        ("A-B=1", "is not a valid variable name"),
        ("FOO\n=1", "is not a valid variable name"),  # `$` in the pattern let a final \n through
        ("MASTER_ADDR=x", "MASTER_ADDR is set by the orchestrator"),
        ("RANK=3", "RANK is set by the orchestrator"),
    ],
)
def test_env_assignment_errors_name_the_flag(item: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_env_assignments([item])
    assert str(info.value).startswith("--env ") and words in str(info.value)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_env_assignment_never_raises_other_errors(item: str) -> None:
    try:
        [(name, value)] = parse_env_assignments([item])
    except ConfigError:
        return
    assert f"{name}={value}" == item and name.isidentifier() and name.isascii()


# --- --env-file --------------------------------------------------------------------------


def test_env_file(tmp_path) -> None:
    path = tmp_path / "job.env"
    path.write_text(
        "# comment\n\nA=1\nexport B = two words \nC='quoted # not a comment'\n"
        'D="double"\nE=\nF=\'unbalanced\nG=a=b\n',
        encoding="utf-8",
    )
    assert load_env_file(path) == [
        ("A", "1"),
        ("B", "two words"),
        ("C", "quoted # not a comment"),
        ("D", "double"),
        ("E", ""),
        ("F", "'unbalanced"),
        ("G", "a=b"),
    ]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("A=1\nJUSTANAME\n", 2, "expected NAME=VALUE"),
        ("A=1\n\n1X=2\n", 3, "'1X' is not a valid variable name"),
        ("WORLD_SIZE=4\n", 1, "WORLD_SIZE is set by the orchestrator"),
    ],
)
def test_env_file_errors_name_file_and_line(tmp_path, text: str, line: int, words: str) -> None:
    path = tmp_path / "job.env"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SourceError) as info:
        load_env_file(path)
    assert str(info.value).startswith(f"{path}:{line}: ") and words in str(info.value)


def test_env_file_missing_or_binary(tmp_path) -> None:
    with pytest.raises(SourceError, match="env file not found"):
        load_env_file(tmp_path / "none.env")
    binary = tmp_path / "b.env"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(SourceError, match="cannot read env file"):
        load_env_file(binary)


# --- forwarding and merging --------------------------------------------------------------


def test_forwarded_env_takes_known_prefixes_only() -> None:
    environ = {
        "NCCL_DEBUG": "INFO",
        "GLOO_X": "1",
        "TORCH_SHOW_CPP_STACKTRACES": "1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "PYTHONPATH": "/src",
        "OMP_NUM_THREADS": "4",
        "HOME": "/root",
        "PATH": "/bin",
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "PYTHONHOME": "/x",
        "PYTHONSTARTUP": "/y",
        "NCCL_BAD\n": "1",
    }
    # CUDA_VISIBLE_DEVICES names the controller's GPUs; the interfaces are chosen per node.
    assert forwarded_env(environ) == [
        ("GLOO_X", "1"),
        ("NCCL_DEBUG", "INFO"),
        ("OMP_NUM_THREADS", "4"),
        ("PYTHONPATH", "/src"),
        ("TORCH_SHOW_CPP_STACKTRACES", "1"),
    ]


def test_merge_env_later_wins_first_order_kept() -> None:
    assert merge_env([("A", "1"), ("B", "1")], [("C", "2"), ("A", "2")], [("B", "3")]) == (
        ("A", "2"),
        ("B", "3"),
        ("C", "2"),
    )
    assert merge_env() == ()


def test_env_file_saved_with_a_byte_order_mark(tmp_path) -> None:
    path = tmp_path / "job.env"
    path.write_bytes(b"\xef\xbb\xbfA=1\nB=2\n")
    assert load_env_file(path) == [("A", "1"), ("B", "2")]
