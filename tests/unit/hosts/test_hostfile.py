"""Hostfile parser: every format, every error naming file:line, and properties.

The central property: no input text makes the parser raise anything but `SourceError`.
"""

from __future__ import annotations

import ipaddress
import string

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orchestrator.errors import ConfigError, SourceError
from orchestrator.hostlist import MAX_EXPANDED_HOSTS, expand_range
from orchestrator.hosts.hostfile import Cluster, Host, load_hostfile, parse_hostfile

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(FAST, max_examples=60)


def names(cluster: Cluster) -> list[str]:
    return [h.name for h in cluster.hosts]


def parse_error(text: str, path: str = "hosts.txt") -> SourceError:
    with pytest.raises(SourceError) as info:
        parse_hostfile(text, path)
    return info.value


# --- the text formats --------------------------------------------------------------------


def test_deepspeed_mpich_bare_and_user_forms() -> None:
    text = (
        "# a comment line\n"
        "node1 slots=8 max_slots=16   # trailing comment\n"
        "node2:4\n"
        "\n"
        "node3\n"
        "alice@node4 port=2222 ifname=eth1 python=/opt/py/bin/python\n"
        "node5 max-slots=2 user=bob\n"
    )
    cluster = parse_hostfile(text, "hosts.txt")
    assert cluster.path == "hosts.txt"
    assert cluster.hosts == (
        Host("node1", slots=8, max_slots=16, source="hosts.txt:2"),
        Host("node2", slots=4, source="hosts.txt:3"),
        Host("node3", source="hosts.txt:5"),
        Host(
            "node4",
            user="alice",
            port=2222,
            ifname="eth1",
            python="/opt/py/bin/python",
            source="hosts.txt:6",
        ),
        Host("node5", max_slots=2, user="bob", source="hosts.txt:7"),
    )


def test_ranges_keep_zero_padding_and_share_fields() -> None:
    cluster = parse_hostfile("gpu[01-03,07] slots=8\ncpu[8-11]:2\n", "h")
    assert names(cluster) == ["gpu01", "gpu02", "gpu03", "gpu07", "cpu8", "cpu9", "cpu10", "cpu11"]
    assert {h.slots for h in cluster.hosts} == {8, 2}
    assert cluster.hosts[0].source == "h:1" and cluster.hosts[-1].source == "h:2"


def test_ipv6_bare_and_bracketed_with_slots() -> None:
    cluster = parse_hostfile("fd00::1\n[fd00::2]:4\n", "h")
    assert [(h.name, h.slots) for h in cluster.hosts] == [("fd00::1", None), ("fd00::2", 4)]


def test_crlf_line_endings() -> None:
    cluster = parse_hostfile("node1 slots=2\r\nnode2:3\r\n", "h")
    assert [(h.name, h.slots) for h in cluster.hosts] == [("node1", 2), ("node2", 3)]


def test_is_local() -> None:
    cluster = parse_hostfile("localhost slots=2\n", "h")
    assert cluster.is_local and cluster.hosts[0].is_local
    assert Host("127.0.0.1").is_local and Host("::1").is_local
    assert not Host("node1").is_local
    assert not parse_hostfile("localhost\nnode1\n", "h").is_local


# --- YAML --------------------------------------------------------------------------------


def test_yaml_list_of_mappings_and_scalars() -> None:
    text = "- host: node1\n  slots: 4\n  user: alice\n- node2\n- host: 'node[3-4]'\n"
    cluster = parse_hostfile(text, "hosts.yaml")
    assert names(cluster) == ["node1", "node2", "node3", "node4"]
    assert cluster.hosts[0] == Host("node1", slots=4, user="alice", source="hosts.yaml:1")
    assert cluster.hosts[1].source == "hosts.yaml:4"


def test_yaml_defaults_apply_and_entries_win() -> None:
    text = (
        "defaults:\n  slots: 2\n  python: /opt/venv/bin/python\n"
        "hosts:\n  - host: a\n  - host: b\n    slots: 8\n"
    )
    cluster = parse_hostfile(text, "cluster.yml")
    assert [(h.name, h.slots, h.python) for h in cluster.hosts] == [
        ("a", 2, "/opt/venv/bin/python"),
        ("b", 8, "/opt/venv/bin/python"),
    ]


def test_yaml_detected_by_content_without_suffix() -> None:
    assert names(parse_hostfile("# hosts\n- host: a\n- b\n", "hosts")) == ["a", "b"]
    assert names(parse_hostfile("hosts:\n  - a\n", "hosts")) == ["a"]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (
            "- host: a\n  slotz: 2\n",
            2,
            ["unknown key 'slotz'", "host, slots, max_slots, user, port, ifname, python"],
        ),
        ("hosts:\n  - a\nextra: 1\n", 3, ["unknown top-level key 'extra'", "defaults, hosts"]),
        ("defaults:\n  host: a\nhosts: [b]\n", 2, ["unknown key 'host'"]),
        ("- host: a\n  slots: [1, 2]\n", 2, ["slots must be a single value"]),
        ("- host: a\n  slots: ~\n", 2, ["slots must be a single value"]),
        ("- slots: 2\n", 1, ["no 'host' field"]),
        ("- host: a\n  host: b\n", 2, ["host given twice"]),
        ("- host: a\n  slots: 0\n", 1, ["slots must be a number from 1 to 65536"]),
        ("- host: 'a b'\n", 1, ["not a valid host name", "' '"]),
        ("- host: a\n- host: [x\n", 3, ["invalid YAML"]),
        ("defaults: {slots: 1}\n", 1, ["missing 'hosts:'"]),
        ("hosts: node1\n", 1, ["expected a list of hosts"]),
    ],
)
def test_yaml_errors_name_the_line(text: str, line: int, words: list[str]) -> None:
    error = parse_error(text, "c.yaml")
    assert str(error).startswith(f"c.yaml:{line}: "), str(error)
    for word in words:
        assert word in str(error)


def test_yaml_nested_too_deeply_is_a_source_error() -> None:
    # PyYAML composes recursively; this used to escape as RecursionError.
    error = parse_error("- " * 3000 + "a\n", "c.yaml")
    assert "nested too deeply" in str(error)


def test_yaml_multi_document_is_refused() -> None:
    assert "invalid YAML" in str(parse_error("- a\n---\n- b\n", "c.yaml"))


# --- text errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("a slots=2\nb slots x\n", 2, ["expected key=value, got 'slots'", "valid keys: ifname"]),
        (
            "a\nb colour=red\n",
            2,
            ["unknown key 'colour'", "ifname, max_slots, port, python, slots, user"],
        ),
        ("a slots=0\n", 1, ["slots must be a number from 1 to 65536, got 0"]),
        ("a slots=-3\n", 1, ["slots must be a number from 1 to 65536, got -3"]),
        ("a:0\n", 1, ["slots must be a number from 1 to 65536"]),
        ("a:\n", 1, ["slots must be a number from 1 to 65536"]),
        ("a slots=two\n", 1, ["slots must be a number from 1 to 65536, got 'two'"]),
        ("a slots=4 max_slots=2\n", 1, ["max_slots=2 is smaller than slots=4"]),
        ("a slots=1 slots=2\n", 1, ["slots given twice"]),
        ("a port=0\n", 1, ["port must be a number from 1 to 65535"]),
        ("a port=65536\n", 1, ["port must be a number from 1 to 65535"]),
        ("slots=2\n", 1, ["must start with the host name"]),
        ("a;rm\n", 1, ["not a valid host name", "';'"]),
        ("a$(reboot)\n", 1, ["not a valid host name", "'$'"]),
        ("`x`\n", 1, ["not a valid host name"]),
        ("bad'quote\n", 1, ["not a valid host name"]),
        ("b!b@a\n", 1, ["not a valid user name"]),
        ("a ifname=eth0;x\n", 1, ["not a valid interface name"]),
        ("a:b:c\n", 1, ["neither host:N nor an IPv6 address"]),
        ("[fd00::1]x\n", 1, ["unexpected 'x'"]),
        ("node[1-3\n", 1, ["unbalanced brackets"]),
        ("node1-3]\n", 1, ["unbalanced brackets"]),
        ("node[3-1]\n", 1, ["counts down"]),
        ("node[a-c]\n", 1, ["bad range"]),
        ("node[]\n", 1, ["bad range"]),
        ("node[0-100000]\n", 1, ["expands to more than"]),
        ("@a\n", 1, ["not a valid user name"]),
    ],
)
def test_text_errors_name_the_line(text: str, line: int, words: list[str]) -> None:
    error = parse_error(text, "hosts.txt")
    assert str(error).startswith(f"hosts.txt:{line}: "), str(error)
    assert (error.path, error.line) == ("hosts.txt", line)
    for word in words:
        assert word in str(error), str(error)
    assert "{" not in str(error).split(": ", 1)[0]  # no unformatted placeholder


@pytest.mark.parametrize(
    "text",
    [
        "node[²-3]\n",  # int() refuses '²' although str.isdigit() accepts it
        "a port=²\n",
        "a slots=٣\n",  # Arabic-indic digit: ASCII digits only
        "- host: a\n  port: '¹'\n",
    ],
)
def test_non_ascii_digits_are_refused(text: str) -> None:
    parse_error(text, "h.yaml" if text.startswith("-") else "h")


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ('- host: "node1\\n"\n', "host name"),  # a `$` in the pattern allowed a final newline
        ('- host: a\n  user: "bob\\n"\n', "user name"),
        ('- host: a\n  ifname: "eth0\\n"\n', "interface name"),
    ],
)
def test_trailing_newline_in_a_name_is_refused(text: str, what: str) -> None:
    assert f"not a valid {what}" in str(parse_error(text, "h.yaml"))


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a\nb\na\n", 3),
        ("a slots=1\n\n# x\na:2\n", 4),
        ("localhost\n127.0.0.1\n", 2),  # the same machine twice
        ("::1\n0::1\n", 2),  # written otherwise
        ("127.0.0.1\n::ffff:127.0.0.1\n", 2),
        ("127.0.0.2\n::ffff:127.0.0.2\n", 2),  # a simulated node twice
        ("n[1-2]\nn2\n", 2),
        ("n[1,1]\n", 1),
    ],
)
def test_duplicate_hosts_are_refused(text: str, line: int) -> None:
    error = parse_error(text, "hosts.txt")
    assert str(error).startswith(f"hosts.txt:{line}: duplicate host")
    assert "first at hosts.txt:" in str(error)


def test_other_loopback_addresses_are_nodes_of_their_own() -> None:
    cluster = parse_hostfile("127.0.0.2\n127.0.0.3 slots=2\nlocalhost\n", "hosts.txt")
    assert names(cluster) == ["127.0.0.2", "127.0.0.3", "localhost"]
    assert cluster.is_local


def test_same_host_on_other_ports_is_two_nodes() -> None:
    assert len(parse_hostfile("a port=22\na port=2222\n").hosts) == 2


@pytest.mark.parametrize(
    "text", ["", "\n\n", "   \n", "# only\n  # comments\n", "hosts: []\n", "---\n", "[]\n"]
)
def test_empty_hostfile_is_an_error_never_localhost(text: str) -> None:
    error = parse_error(text, "hosts.yaml" if text.startswith(("h", "-", "[")) else "hosts")
    assert "no hosts" in str(error) and "no fallback to localhost" in str(error)


def test_nul_byte_is_refused() -> None:
    assert "NUL" in str(parse_error("a\x00b\n"))


# --- load_hostfile -----------------------------------------------------------------------


def test_load_missing_directory_binary(tmp_path) -> None:
    with pytest.raises(SourceError, match="hostfile not found"):
        load_hostfile(tmp_path / "nope.txt")
    with pytest.raises(SourceError, match="is a directory"):
        load_hostfile(tmp_path)
    binary = tmp_path / "bin"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(SourceError, match="cannot read hostfile"):
        load_hostfile(binary)
    good = tmp_path / "h.txt"
    good.write_text("a slots=2\n")
    assert load_hostfile(good).hosts[0].source == f"{good}:1"


def test_source_error_is_a_config_error_with_exit_code_2() -> None:
    error = parse_error("a slots=0\n")
    assert isinstance(error, ConfigError) and error.exit_code == 2


# --- property: nothing but SourceError ---------------------------------------------------


def parse_or_source_error(text: str, path: str) -> None:
    try:
        cluster = parse_hostfile(text, path)
    except SourceError as exc:
        assert exc.path == path and str(exc).startswith(path)
        return
    assert cluster.hosts and all(isinstance(h, Host) for h in cluster.hosts)


FRAGMENTS = st.sampled_from(
    [
        "node",
        "n1",
        "a",
        "localhost",
        "127.0.0.1",
        "::1",
        "fd00::2",
        "10.0.0.1",
        "gpu",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "#",
        ":",
        "::",
        "@",
        "=",
        "[",
        "]",
        "-",
        ",",
        "0",
        "1",
        "01",
        "9",
        "65535",
        "99999999999999999999",
        "²",
        "٣",
        "slots",
        "max_slots",
        "max-slots",
        "port",
        "user",
        "ifname",
        "python",
        "slots=",
        "=2",
        "- ",
        "-",
        "host:",
        "hosts:",
        "defaults:",
        "---",
        "...",
        "{",
        "}",
        "'",
        '"',
        "!!python/object:os.system",
        "&a",
        "*a",
        "<<:",
        "? ",
        "|",
        ">",
        "~",
        "null",
        "\x00",
        "\x85",
        "\u2028",
        "é",
        "$(x)",
        ";",
        "`",
        "\\",
        "%",
        "^",
        "!",
        "*",
        "&",
        "[1-3]",
        "[01-10,12]",
        "[9-1]",
        "[1-999999]",
    ]
)


@FAST
@given(st.text(), st.sampled_from(["h", "h.yaml", "h.txt"]))
@example("- " * 3000, "h.yaml")
@example("node[²-3]", "h")
@example("a port=¹", "h")
def test_any_text_parses_or_raises_source_error(text: str, path: str) -> None:
    parse_or_source_error(text, path)


@FAST
@given(st.lists(FRAGMENTS, max_size=40).map("".join), st.sampled_from(["h", "h.yaml"]))
def test_hostfile_shaped_text_parses_or_raises_source_error(text: str, path: str) -> None:
    parse_or_source_error(text, path)


@st.composite
def yamlish(draw) -> str:
    value = st.one_of(
        st.integers(-5, 70000),
        st.text(max_size=8),
        st.none(),
        st.lists(st.integers(0, 3), max_size=2),
        FRAGMENTS,
    )
    entry = st.one_of(
        value,
        st.dictionaries(
            st.sampled_from(
                ["host", "slots", "max_slots", "user", "port", "ifname", "python", "bogus", "1"]
            ),
            value,
            max_size=4,
        ),
    )
    root = st.one_of(
        st.lists(entry, max_size=4),
        st.fixed_dictionaries(
            {"hosts": st.one_of(st.lists(entry, max_size=3), value)},
            optional={"defaults": entry, "x": value},
        ),
        value,
    )
    return yaml.safe_dump(draw(root))


@settings(FAST, max_examples=100)
@given(yamlish(), st.sampled_from(["h.yaml", "h"]))
def test_yaml_shaped_documents_parse_or_raise_source_error(text: str, path: str) -> None:
    parse_or_source_error(text, path)


# --- property: round trip ----------------------------------------------------------------

LABEL = st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=10).filter(
    lambda s: s[0] != "-" and s[-1] != "-"
)
HOSTNAME = st.one_of(
    st.lists(LABEL, min_size=1, max_size=3).map(".".join),
    st.ip_addresses(v=4).map(str).filter(lambda a: not a.startswith("127.")),
    st.ip_addresses(v=6).filter(lambda a: not a.is_loopback and a.ipv4_mapped is None).map(str),
)
WORD = string.ascii_letters + string.digits + "_"


def word(first: str, rest: str, max_size: int) -> st.SearchStrategy[str]:
    return st.builds(str.__add__, st.sampled_from(first), st.text(rest, max_size=max_size))


USER = word(string.ascii_letters + "_", WORD + ".-", 8)
IFNAME = word(WORD + ".^=-", WORD + ".:@,^=-", 7)
PYTHON = word("/", WORD + "/.-", 20)


@st.composite
def host_entries(draw) -> list[Host]:
    hosts = draw(
        st.lists(
            HOSTNAME.filter(lambda n: not Host(n).is_local), min_size=1, max_size=6, unique=True
        )
    )
    result = []
    for name in hosts:
        slots = draw(st.none() | st.integers(1, 64))
        max_slots = draw(st.none() | st.integers(slots or 1, 128))
        result.append(
            Host(
                name=name,
                slots=slots,
                max_slots=max_slots,
                user=draw(st.none() | USER),
                port=draw(st.none() | st.integers(1, 65535)),
                ifname=draw(st.none() | IFNAME),
                python=draw(st.none() | PYTHON),
            )
        )
    return result


def is_v6(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).version == 6
    except ValueError:
        return False


def text_line(host: Host, mpich: bool) -> str:
    target = f"{host.user}@{host.name}" if host.user else host.name
    fields = []
    if host.slots is not None:
        if mpich:
            target = (f"{host.user}@" if host.user else "") + (
                f"[{host.name}]:{host.slots}" if is_v6(host.name) else f"{host.name}:{host.slots}"
            )
        else:
            fields.append(f"slots={host.slots}")
    for key in ("max_slots", "port", "ifname", "python"):
        if getattr(host, key) is not None:
            fields.append(f"{key}={getattr(host, key)}")
    return " ".join([target, *fields])


def yaml_entry(host: Host) -> dict:
    return {
        k: getattr(host, k)
        for k in ("slots", "max_slots", "user", "port", "ifname", "python")
        if getattr(host, k) is not None
    }


def fields_of(cluster_or_hosts) -> list[tuple]:
    hosts = getattr(cluster_or_hosts, "hosts", cluster_or_hosts)
    return [(h.name, h.slots, h.max_slots, h.user, h.port, h.ifname, h.python) for h in hosts]


@ROUND_TRIP
@given(
    host_entries(),
    st.sampled_from(["deepspeed", "mpich", "yaml-list", "yaml-hosts"]),
    st.booleans(),
)
def test_round_trip_through_every_format(hosts: list[Host], form: str, comments: bool) -> None:
    if form in ("deepspeed", "mpich"):
        lines = [text_line(h, mpich=form == "mpich") for h in hosts]
        if comments:
            lines = ["# generated", *(f"  {line}   # node {i}" for i, line in enumerate(lines))]
        text, path = "\n".join(lines) + "\n", "hosts.txt"
    elif form == "yaml-list":
        text = yaml.safe_dump([{"host": h.name, **yaml_entry(h)} for h in hosts])
        path = "hosts.yaml"
    else:
        text = yaml.safe_dump({"hosts": [{"host": h.name, **yaml_entry(h)} for h in hosts]})
        path = "hosts"  # detected by content
    cluster = parse_hostfile(text, path)
    assert fields_of(cluster) == fields_of(hosts)
    assert all(h.source.startswith(f"{path}:") for h in cluster.hosts)


@settings(ROUND_TRIP, max_examples=30)
@given(host_entries())
def test_text_source_lines_point_at_each_host(hosts: list[Host]) -> None:
    text = "".join(f"# host {i}\n{text_line(h, mpich=False)}\n" for i, h in enumerate(hosts))
    cluster = parse_hostfile(text, "f")
    assert [h.source for h in cluster.hosts] == [f"f:{2 * i + 2}" for i in range(len(hosts))]


# --- property: range expansion -----------------------------------------------------------

GROUP_ITEM = st.tuples(st.integers(0, 300), st.integers(0, 10), st.booleans(), st.integers(0, 3))


def group_text(items) -> tuple[str, list[int]]:
    parts, numbers = [], []
    for start, length, is_range, pad in items:
        lo = str(start).zfill(len(str(start)) + pad)
        if is_range:
            parts.append(f"{lo}-{start + length}")
            numbers.extend(range(start, start + length + 1))
        else:
            parts.append(lo)
            numbers.append(start)
    return ",".join(parts), numbers


@settings(FAST, max_examples=100)
@given(st.lists(st.lists(GROUP_ITEM, min_size=1, max_size=3), min_size=1, max_size=3))
def test_range_expansion_counts_multiply(groups) -> None:
    texts = [group_text(items) for items in groups]
    target = "n" + "x".join(f"[{text}]" for text, _ in texts)
    expanded = expand_range(target)
    expected = 1
    for _, numbers in texts:
        expected *= len(numbers)
    assert len(expanded) == expected
    assert all(name.startswith("n") and "[" not in name for name in expanded)


@FAST
@given(st.integers(0, 10_000), st.integers(0, 200), st.integers(1, 6))
def test_range_keeps_zero_padding_width(start: int, length: int, width: int) -> None:
    lo = str(start).zfill(width)
    expanded = expand_range(f"node[{lo}-{start + length}]")
    assert len(expanded) == length + 1
    assert [int(name[4:]) for name in expanded] == list(range(start, start + length + 1))
    if lo.startswith("0"):
        assert all(len(name[4:]) >= len(lo) for name in expanded)
    else:
        assert expanded[0] == f"node{start}"


def test_range_without_brackets_is_itself() -> None:
    assert expand_range("plain-host") == ["plain-host"]


def test_range_expansion_limit_counts_all_groups_and_items() -> None:
    half = MAX_EXPANDED_HOSTS // 2
    with pytest.raises(ValueError, match="expands to more than"):
        expand_range(f"n[0-{half}]x[0-2]")
    with pytest.raises(ValueError, match="expands to more than"):  # many items in one group
        expand_range("n[" + ",".join([f"0-{half}"] * 3) + "]")


def test_every_example_hostfile_parses() -> None:
    from pathlib import Path

    from orchestrator.hosts.hostfile import load_hostfile

    examples = sorted((Path(__file__).resolve().parents[3] / "hostfiles").iterdir())
    assert len(examples) >= 5
    for path in examples:
        assert load_hostfile(path).hosts, path


@pytest.mark.parametrize(
    "text", ["node1 slots=2\nnode2 slots=2\n", "- host: node1\n- host: node2\n"]
)
def test_a_byte_order_mark_from_an_editor_is_not_part_of_the_first_host(tmp_path, text) -> None:
    path = tmp_path / "hosts.txt"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())  # what "UTF-8 with BOM" editors save
    assert [host.name for host in load_hostfile(path).hosts] == ["node1", "node2"]
