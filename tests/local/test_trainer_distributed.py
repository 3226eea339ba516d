"""Choosing the device, and joining the process group failing with one clear line."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from orchestrator.trainer.config import Topology, resolve_topology
from orchestrator.trainer.distributed import start_runtime
from orchestrator.trainer.entry import main
from orchestrator.trainer.exits import EXIT_FAILURE, TrainerUsageError
from orchestrator.trainer.placement import (
    DeviceChoice,
    agree_on_kind,
    decide_device,
    local_placement,
)
from tests.trainer_helpers import FAST, assert_clean_failure, run_trainer


@pytest.mark.parametrize(
    ("preference", "gpus", "local_rank", "local_world", "kind"),
    [
        ("auto", 0, 0, 1, "cpu"),
        ("auto", 1, 0, 1, "cuda"),
        ("auto", 2, 1, 2, "cuda"),
        ("auto", 8, 3, 4, "cuda"),
        ("cpu", 8, 0, 1, "cpu"),
        ("cuda", 1, 0, 1, "cuda"),
        ("cuda", 2, 1, 2, "cuda"),
    ],
)
def test_device_decision(
    preference: str, gpus: int, local_rank: int, local_world: int, kind: str
) -> None:
    assert decide_device(preference, gpus, local_rank, local_world) == DeviceChoice(kind)


def test_auto_falls_back_to_cpu_on_every_rank_when_gpus_are_fewer_than_ranks() -> None:
    # `orchestrator launch hostfiles/local.txt`: 2 ranks on a machine with one GPU.
    # Both ranks must choose alike: one on NCCL and one on gloo would never meet.
    choices = [decide_device("auto", 1, local_rank, 2) for local_rank in (0, 1)]
    assert {c.kind for c in choices} == {"cpu"}
    note = choices[0].note
    assert note is not None and "\n" not in note
    for needle in ("--device auto chose cpu", "2 ranks on this node", "1 GPU(s)",
                   "--nproc_per_node=1"):  # fmt: skip
        assert needle in note, (needle, note)


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        (["a"], [(0, 1)]),
        (["a", "a"], [(0, 2), (1, 2)]),
        (["a", "b", "a", "b"], [(0, 2), (0, 2), (1, 2), (1, 2)]),
        (["n1", "n1", "n1", "n2"], [(0, 3), (1, 3), (2, 3), (0, 1)]),
    ],
)
def test_local_ranks_follow_global_rank_order_among_ranks_of_one_host(
    hosts: list[str], expected: list[tuple[int, int]]
) -> None:
    assert [local_placement(hosts, rank) for rank in range(len(hosts))] == expected


@pytest.mark.parametrize("gpus", [0, 1])
def test_two_init_method_ranks_on_a_machine_with_fewer_gpus_both_choose_cpu(gpus: int) -> None:
    # The 1-GPU machine that hung: two ranks by hand, no LOCAL_RANK. Derived from their
    # shared host name they are local ranks 0 and 1 of 2, so neither claims cuda:1.
    choices = [decide_device("auto", gpus, *local_placement(["h", "h"], r)) for r in (0, 1)]
    assert [c.kind for c in choices] == ["cpu", "cpu"]
    with_two = [decide_device("auto", 2, *local_placement(["h", "h"], r)) for r in (0, 1)]
    assert [c.kind for c in with_two] == ["cuda", "cuda"]


def test_auto_on_mixed_nodes_chooses_cpu_for_every_rank() -> None:
    choice = agree_on_kind(["cuda", "cuda", "cpu"], ["gpu1", "gpu1", "cpu1"])
    assert choice is not None and choice.kind == "cpu"
    assert choice.note is not None and "cpu1 cannot give each of its ranks a GPU" in choice.note
    assert agree_on_kind(["cuda", "cuda"], ["a", "b"]) is None
    assert agree_on_kind(["cpu", "cpu"], ["a", "b"]) is None


@pytest.mark.parametrize(
    ("gpus", "local_rank", "local_world", "needles"),
    [
        (0, 0, 1, ["--device cuda", "no CUDA device", "--device cpu"]),
        (1, 0, 2, ["--device cuda", "2 ranks on this node", "1 GPU(s)", "--nproc_per_node=1"]),
        (1, 1, 2, ["--device cuda", "2 ranks on this node"]),
        # A hand-given --local-rank that does not fit the node's GPUs.
        (1, 3, 1, ["local rank 3 has no GPU", "--local-rank"]),
    ],
)
def test_explicit_cuda_without_enough_gpus_is_a_usage_error(
    gpus: int, local_rank: int, local_world: int, needles: list[str]
) -> None:
    with pytest.raises(TrainerUsageError) as caught:
        decide_device("cuda", gpus, local_rank, local_world)
    for needle in needles:
        assert needle in str(caught.value), (needle, str(caught.value))


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_0_prints_why_auto_chose_cpu(
    rank: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # One GPU faked at the torch.cuda boundary; this machine has none.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # leave this process's thread count alone
    topology = Topology(rank, 2, rank, 2, None, "torchrun")  # no group: nothing to join
    runtime = start_runtime(topology, "auto", 60.0)
    assert runtime.device == torch.device("cpu")
    out = capsys.readouterr().out
    assert out.count("--device auto chose cpu") == (1 if rank == 0 else 0), out


@pytest.mark.parametrize(
    ("url", "needles"),
    [
        ("file:///nonexistent/rdzv-dir/store", ["directory /nonexistent/rdzv-dir does not exist"]),
        ("file://", ["needs a file path"]),
        ("tcp://127.0.0.1", ["needs a host and a port"]),
        ("tcp://:29500", ["needs a host and a port"]),
        ("tcp://node1:port", ["needs a host and a port"]),
    ],
)
def test_init_urls_torch_would_wait_on_are_refused(url: str, needles: list[str]) -> None:
    with pytest.raises(TrainerUsageError) as caught:
        resolve_topology({}, url, 0, 2)
    assert f"--init-method {url}:" in str(caught.value)
    for needle in needles:
        assert needle in str(caught.value)


def test_init_file_url_naming_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TrainerUsageError, match="names a directory, not a file"):
        resolve_topology({}, f"file://{tmp_path}", 0, 2)
    ok = resolve_topology({}, f"file://{tmp_path}/store", 1, 2)
    assert ok.init_method == f"file://{tmp_path}/store"


def test_init_file_url_in_a_missing_directory_exits_2_at_once() -> None:
    # torch itself would retry opening the file silently for 30 minutes.
    url = "file:///nonexistent/rdzv-dir/store"
    result = run_trainer([*FAST, "--init-method", url, "--rank", "0", "--world-size", "2"],
                         timeout=60)  # fmt: skip
    assert_clean_failure(result, f"--init-method {url}", "/nonexistent/rdzv-dir")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_rank_0_exits_1_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real rendezvous against a port nobody listens on, given up after --timeout.
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    url = f"tcp://127.0.0.1:{_closed_port()}"
    code = main([*FAST, "--device", "cpu", "--init-method", url, "--rank", "1",
                 "--world-size", "2", "--timeout", "1"])  # fmt: skip
    assert code == EXIT_FAILURE
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert f"--init-method {url}: rank 1 of 2 could not join the process group" in lines[0]
    assert "timed out" in lines[0] and "Traceback" not in lines[0]
    assert not dist.is_initialized()
