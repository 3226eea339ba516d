"""The check group: what `orchestrator check` measures beyond the job's and hosts' flags."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.options.declare import OptionGroup, option

COLLECTIVE_BACKENDS = ("auto", "nccl", "gloo")


@dataclass(frozen=True)
class CollectiveOptions(OptionGroup):
    """The collectives job's own flags."""

    backend: str = option(
        "auto",
        "auto: NCCL when every node has CUDA devices, else gloo.",
        metavar="[" + "|".join(COLLECTIVE_BACKENDS) + "]",
        choices=COLLECTIVE_BACKENDS,
    )
    max_size: str | None = option(
        None,
        "Largest message of the bandwidth sweep (from 1K, doubling), e.g. 64M or 1G. "
        "Default: 64M with gloo, 1G with NCCL.",
        metavar="SIZE",
    )  # read by check/run.py's parse_max_size, which knows the sweep's bound
    skip_bandwidth: bool = option(False, "Check the collectives only.", switch="on")
    json_path: str | None = option(
        None, "Also write the whole report as JSON to FILE.", name="--json", metavar="FILE"
    )
    timeout: float = option(
        180.0,
        "Give up on the collectives job after this long.",
        metavar="SECONDS",
        kind=float,
        minimum=1,
    )
