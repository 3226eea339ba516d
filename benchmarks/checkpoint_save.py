"""How long the bundled trainer's checkpoint takes, which is what a time limit's warning
(`--signal`, 120 s by default) must leave room for.

    python benchmarks/checkpoint_save.py [--repeat 5] [--dir DIR]

For the trainer's models (mlp, cnn) with their real state (model, SGD momentum, step, RNG),
and for wider MLPs standing in for bigger models, it times `save_checkpoint` (torch.save to
a temp file, fsync, rename, the `latest` pointer) against a baseline measured in the same
run: the same number of bytes written with one write() and fsync'd. Printed: sizes, median
seconds and MB/s, and the ratio checkpoint/baseline. `--dir` is where they are written
(default: a temp folder on this machine; point it at the shared file system your jobs
checkpoint to, since that is what the warning must cover).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, machine_line, median, parser, say, table

sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from orchestrator.trainer.checkpoint import save_checkpoint  # noqa: E402
from orchestrator.trainer.models import build_model  # noqa: E402


def state_of(model: torch.nn.Module) -> dict:
    """The trainer's checkpoint layout, with SGD momentum filled in as after a step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return {
        "format": "bench",
        "step": 1,
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "rng": {"torch": torch.get_rng_state()},
    }


def cases() -> list[tuple[str, torch.nn.Module]]:
    found = [
        ("mlp (the trainer's default)", build_model("mlp", (64,), 10)),
        ("cnn", build_model("cnn", (3, 32, 32), 10)),
    ]
    for width in (2048, 8192):  # two hidden layers of `width`: ~4.3 M and ~68 M parameters
        found.append(
            (
                f"mlp, hidden {width}",
                torch.nn.Sequential(
                    torch.nn.Linear(64, width),
                    torch.nn.Linear(width, width),
                    torch.nn.Linear(width, 10),
                ),
            )
        )
    return found


def raw_write(path: Path, size: int) -> None:
    data = os.urandom(min(size, 1 << 20)) * (size // (1 << 20) + 1)
    with open(path, "wb") as f:
        f.write(data[:size])
        f.flush()
        os.fsync(f.fileno())


def main() -> None:
    args = parser(__doc__.splitlines()[0], "", 5)
    args.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    opts = args.parse_args()
    say(machine_line())
    rows = []
    with tempfile.TemporaryDirectory(dir=opts.dir) as where:
        folder = Path(where)
        for name, model in cases():
            state = state_of(model)
            params = sum(p.numel() for p in model.parameters())
            saves, writes, size = [], [], 0
            for k in range(opts.repeat):  # interleaved: load hits both alike
                started = time.perf_counter()
                path = save_checkpoint(folder / "ckpt", {**state, "step": k + 1}, keep=1)
                saves.append(time.perf_counter() - started)
                size = path.stat().st_size
                started = time.perf_counter()
                raw_write(folder / "raw.bin", size)
                writes.append(time.perf_counter() - started)
            save, write = median(saves), median(writes)
            rows.append(
                [
                    name,
                    f"{params:,}",
                    f"{size / 1e6:.1f}",
                    f"{save:.4f}",
                    f"{size / 1e6 / save:.0f}",
                    f"{write:.4f}",
                    f"{save / write:.2f}",
                ]
            )
    say(
        table(
            ["model", "params", "MB", "save s", "save MB/s", "raw write s", "save/raw"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
