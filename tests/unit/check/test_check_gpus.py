"""`orchestrator check` on GPU nodes: NCCL only when every rank has a GPU of its own, as the
trainer's --device auto decides, counted against the slot ids a selection chose."""

from __future__ import annotations

import pytest

from orchestrator.check.diagnose import node_problems
from orchestrator.check.facts import choose_backend
from orchestrator.check.report import node_table
from tests.check_helpers import MASTER, facts, node

GPU = {"nccl": "yes", "nccl_version": "2.21.5"}


def gpu_node(index: int, devices: int, slots: int = 2, **kwargs):
    extra = {"port": "29500", "port_free": "yes"} if index == 0 else {}
    return node(index, slots, probe=facts(**GPU, cuda_devices=str(devices), **extra), **kwargs)


def test_nccl_needs_a_gpu_per_rank() -> None:
    nodes = [gpu_node(0, 8), gpu_node(1, 1)]
    # auto: like the trainer's --device auto, gloo when a node has fewer GPUs than ranks
    # (a 1-GPU machine with slots=2) ...
    assert choose_backend(nodes) == (
        "gloo",
        "node1 has 1 CUDA device(s) for 2 rank(s) and NCCL needs one per rank",
    )
    enough = [nodes[0], gpu_node(1, 2)]
    assert choose_backend(enough) == ("nccl", "every node has a CUDA device per rank and NCCL")
    # ... and --backend nccl there is a problem that says what to change.
    problems = [str(p) for p in node_problems(nodes, MASTER, "nccl")]
    assert problems == [
        "node1: 1 CUDA device(s) for 2 rank(s): NCCL needs one GPU per rank; "
        "lower slots= / --nproc-per-node"
    ]
    mixed = [nodes[0], node(1)]
    assert choose_backend(mixed) == ("gloo", "not every node has CUDA devices")
    assert choose_backend(mixed, "nccl") == ("nccl", "--backend nccl")
    assert "node1 see no CUDA device while node0 do" in str(node_problems(mixed, MASTER, "gloo")[0])


@pytest.mark.parametrize(
    ("devices", "slot_ids", "shortfall"),
    [
        (4, (0, 1), None),
        (4, (2, 3), None),  # two ranks, the node's last two GPUs
        (4, (3, 4), "4 CUDA device(s), none for the chosen slot id(s) 4"),
        (4, (4, 5), "4 CUDA device(s), none for the chosen slot id(s) 4,5"),
        (1, (1,), "1 CUDA device(s), none for the chosen slot id(s) 1"),
    ],
)
def test_a_selection_needs_the_gpus_it_names(
    devices: int, slot_ids: tuple[int, ...], shortfall: str | None
) -> None:
    # slots=8 in the hostfile on a 4-GPU node: the rank count fits, the ids may not, and a
    # rank given CUDA_VISIBLE_DEVICES=4,5 there sees no GPU at all.
    chosen = gpu_node(1, devices, slots=len(slot_ids), slot_ids=slot_ids)
    assert chosen.gpu_shortfall == shortfall
    nodes = [gpu_node(0, 8), chosen]
    if shortfall is None:
        assert choose_backend(nodes)[0] == "nccl"
        assert node_problems(nodes, MASTER, "nccl") == []
        return
    assert choose_backend(nodes) == ("gloo", f"node1 has {shortfall} and NCCL needs one per rank")
    problems = node_problems(nodes, MASTER, "nccl")
    assert [str(p) for p in problems] == [
        f"node1: {shortfall}: NCCL needs one GPU per rank; choose slot ids below {devices} "
        "with --include/--exclude/--num-gpus, or set slots= to the node's GPU count"
    ]
    row = node_table(nodes, MASTER, problems, "nccl").splitlines()[2]
    assert f"{devices}/{len(slot_ids)} ({','.join(map(str, slot_ids))}) !" in row


def test_the_report_says_which_slot_ids_were_chosen() -> None:
    assert gpu_node(1, 4, slots=2, slot_ids=(1, 3)).to_dict()["slot_ids"] == [1, 3]
    assert gpu_node(1, 4).to_dict()["slot_ids"] is None
