"""What torch's flight recorder costs a rank, as every launch turns it on.

    python benchmarks/flight_recorder.py [--repeat 5] [--collectives 2000] [--steps 60]

Two local ranks under torchrun (gloo, CPU) time, with the recorder as a launch sets it
(TORCH_FR_BUFFER_SIZE=2000, orchestrator/agent/flight.py) and with it off (0): a loop of
small all_reduces (4 floats: the recorder's cost per collective, little else), and steps of
the bundled trainer's MLP under DDP. torch reads the setting once per process, so each
measurement is a torchrun of its own; off and on alternate, `--repeat` times each, so load
hits them alike. Printed: medians per collective and per step, and the ratios on/off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import machine_line, median, parser, say, table

REPO = Path(__file__).resolve().parents[1]
WORKER = r"""
import json, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from orchestrator.trainer.models import build_model

collectives, steps, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(build_model("mlp", (1, 28, 28), 10))
optim = torch.optim.SGD(model.parameters(), lr=0.01)
images, labels = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
small = torch.ones(4)
for _ in range(50):
    dist.all_reduce(small)  # warm up
dist.barrier()
began = time.perf_counter()
for _ in range(collectives):
    dist.all_reduce(small)
per_collective = (time.perf_counter() - began) / collectives
dist.barrier()
began = time.perf_counter()
for _ in range(steps):
    optim.zero_grad()
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    optim.step()
per_step = (time.perf_counter() - began) / steps
if dist.get_rank() == 0:
    with open(out, "w") as f:
        json.dump({"collective": per_collective, "step": per_step}, f)
dist.destroy_process_group()
"""


def measure(work: Path, size: str, collectives: int, steps: int) -> dict[str, float]:
    worker, out = work / "worker.py", work / "times.json"
    worker.write_text(WORKER)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            str(worker), str(collectives), str(steps), str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_FR_BUFFER_SIZE": size}
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    args = parser(__doc__, nodes="2", repeat=5)
    args.add_argument("--collectives", type=int, default=2000)
    args.add_argument("--steps", type=int, default=60)
    options = args.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"0": [], "2000": []}
    with tempfile.TemporaryDirectory(prefix="flight-bench-") as work:
        for _ in range(options.repeat):
            for size in runs:
                runs[size].append(measure(Path(work), size, options.collectives, options.steps))
    say(machine_line())
    rows = []
    for what, unit, scale in (("collective", "us", 1e6), ("step", "ms", 1e3)):
        off = median([r[what] for r in runs["0"]])
        on = median([r[what] for r in runs["2000"]])
        rows.append(
            (f"{what} ({unit})", f"{off * scale:.1f}", f"{on * scale:.1f}", f"{on / off:.2f}x")
        )
    say(table(("median per", "recorder off", "recorder on (2000)", "on / off"), rows))


if __name__ == "__main__":
    main()
