"""Command line of ``python -m orchestrator.trainer``: parse, validate, then train.

argparse (not click) because this module is also a template people copy into their
own projects, and the standard library is all it needs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from orchestrator.trainer.config import (
    DATASETS,
    DEVICES,
    MODELS,
    PRECISIONS,
    RESUME_LATEST,
    TrainConfig,
    resolve_topology,
)
from orchestrator.trainer.exits import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    TrainerRuntimeError,
    TrainerUsageError,
)
from orchestrator.trainer.reporting import emit

PROG = "python -m orchestrator.trainer"

DESCRIPTION = """\
Data-parallel (DDP) training of a small classifier: the trainer `orchestrator launch`
runs by default, and a reference to copy from.

  torchrun --nproc_per_node=2 -m orchestrator.trainer        # 2 ranks on this machine
  python -m orchestrator.trainer                              # 1 process, no torchrun
  python -m orchestrator.trainer --init-method tcp://HOST:PORT --rank R --world-size N

Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) it joins with env://.
The backend is NCCL when training on CUDA and gloo otherwise.
"""

EPILOG = """\
global batch:
  Each optimizer step averages the gradient over world_size x --batch-size x
  --grad-accum samples. Which samples is fixed by --seed and the epoch alone, so any
  split of the same global batch (2 ranks x 16, or 1 rank x 16 x accum 2, ...) trains
  the same model up to float rounding. Samples that do not fill a last global batch
  of an epoch are dropped for that epoch.

  When ORCHESTRATOR_LAUNCH_WORLD_SIZE (set by `orchestrator launch`: the ranks the run
  was launched with) differs from WORLD_SIZE, the run went on with fewer (or more)
  ranks and keeps its global batch: launch world size x --batch-size x --grad-accum.
  Each rank then takes its share in more micro-steps, and where the global batch does
  not divide evenly, shards one sample apart, each micro-batch's loss weighted by its
  sample count, so the gradient is the same mean over the same samples. --global-batch
  G fixes the global batch the same way by hand.

output (rank 0, stdout, one flushed line each):
  step 20/200 epoch 1/2 loss 1.2345 samples/s 10240 step_ms 6.25 data_wait 1.9%
  done: 200 steps, final loss 0.0912, test acc 97.1%, 10240 samples/s, data wait 1.9%, \
train 1.3 s, total 4.2 s

exit codes:
  0    finished
  1    failed: a rank could not join the process group in time, or lost a peer
       during training (one line each), or an unexpected failure (with a traceback)
  2    bad input: option value, missing dataset, unreadable, mismatched or already
       finished checkpoint
  128+N  stopped by signal N (143 for SIGTERM, 138 for SIGUSR1), after saving a
       checkpoint when --checkpoint-dir is set: resumable, but not finished
  130  interrupted by Ctrl-C (no checkpoint)

signals:
  During training, SIGTERM or SIGUSR1 (e.g. SLURM's --signal=USR1@120) make all ranks
  agree on one step to stop after (within about 0.25 s, or two steps if slower),
  save a checkpoint there from rank 0, and exit 128+N without a traceback. Before the
  first step they keep their default action and end the process at once.

peers:
  A rank whose peer exits ends with exit 1 within seconds (its next collective
  fails); a peer that stops answering without exiting ends it within --timeout.

devices:
  --device auto trains on cuda:LOCAL_RANK when this node has a GPU for each of its
  ranks (GPUs counted after CUDA_VISIBLE_DEVICES), and on CPU otherwise; with
  --init-method and no local rank given, ranks sharing a host name share its GPUs.
  Every rank prints its choice in its start line.

CPU threads:
  OMP_NUM_THREADS wins when set (torchrun sets 1 when it starts several ranks per node);
  otherwise each rank takes cores / LOCAL_WORLD_SIZE threads.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like every other bad-input message, instead of usage + error.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = TrainConfig()
    g = p.add_argument_group("model and data")
    g.add_argument(
        "--model",
        default=d.model,
        metavar="{" + ",".join(MODELS) + "}",
        help="mlp: 2 hidden layers of 256, any input shape; cnn: LeNet-style, "
        "3x32x32 images (default: %(default)s)",
    )
    g.add_argument(
        "--dataset",
        default=d.dataset,
        metavar="{" + ",".join(DATASETS) + "}",
        help="synthetic: learnable Gaussian clusters drawn from --seed (64 features, "
        "or 3x32x32 images with --model cnn); cifar10: the python-pickle batches "
        "in --data-path, no download; npz: arrays x, y and optionally x_test, "
        "y_test in --data-path (default: %(default)s)",
    )
    g.add_argument(
        "--data-path",
        type=Path,
        metavar="PATH",
        help="cifar-10-batches-py directory (or its parent) for cifar10; the .npz file for npz",
    )
    g.add_argument(
        "--synthetic-samples",
        type=int,
        default=d.synthetic_samples,
        metavar="N",
        help="training samples of the synthetic dataset (default: %(default)s)",
    )
    g = p.add_argument_group("optimisation")
    g.add_argument(
        "--batch-size",
        type=int,
        default=d.batch_size,
        metavar="B",
        help="samples per rank per micro-step (default: %(default)s)",
    )
    g.add_argument(
        "--grad-accum",
        type=int,
        default=d.grad_accum,
        metavar="A",
        help="micro-steps accumulated per optimizer step; gradients are "
        "all-reduced only on the last (default: %(default)s)",
    )
    g.add_argument(
        "--global-batch",
        type=int,
        metavar="G",
        help="samples per optimizer step whatever the world size, instead of "
        "world size x --batch-size x --grad-accum: each rank takes G / world size "
        "(or one more) in micro-batches of at most --batch-size; e.g. to resume on "
        "fewer ranks by hand",
    )
    g.add_argument(
        "--epochs",
        type=int,
        default=d.epochs,
        metavar="E",
        help="passes over the training data (default: %(default)s)",
    )
    g.add_argument(
        "--max-steps",
        type=int,
        metavar="N",
        help="stop after N optimizer steps in total, counting resumed ones "
        "(default: all steps of --epochs)",
    )
    g.add_argument(
        "--lr", type=float, default=d.lr, help="SGD learning rate (default: %(default)s)"
    )
    g.add_argument(
        "--momentum", type=float, default=d.momentum, help="SGD momentum (default: %(default)s)"
    )
    g.add_argument(
        "--seed",
        type=int,
        default=d.seed,
        help="fixes weights, synthetic data and the sample order (default: %(default)s)",
    )
    g.add_argument(
        "--precision",
        default=d.precision,
        metavar="{" + ",".join(PRECISIONS) + "}",
        help="fp32; bf16: autocast on CUDA, and on CPU too (it works there, but is faster "
        "than fp32 only on CPUs with native bf16); fp16: autocast with a grad scaler, "
        "CUDA only (default: %(default)s)",
    )
    g.add_argument(
        "--device",
        default=d.device,
        metavar="{" + ",".join(DEVICES) + "}",
        help="auto: cuda:LOCAL_RANK if this node has a GPU for each of its ranks "
        "(LOCAL_WORLD_SIZE), else cpu with a note saying why; cuda: fail (exit 2) "
        "unless it has (default: %(default)s)",
    )
    g.add_argument(
        "--no-cuda-graphs",
        dest="cuda_graphs",
        action="store_false",
        help="on CUDA, run the model's forward and backward kernel by kernel instead of "
        "replaying them as CUDA graphs (graphs are used with --grad-accum 1)",
    )
    g = p.add_argument_group("checkpoints")
    g.add_argument(
        "--checkpoint-dir",
        type=Path,
        metavar="DIR",
        help="save checkpoints here (rank 0, atomically) and the final weights as "
        "DIR/final.pt; a checkpoint is also saved at the end and on SIGTERM/SIGUSR1",
    )
    g.add_argument(
        "--checkpoint-every",
        type=int,
        default=d.checkpoint_every,
        metavar="N",
        help="also save every N optimizer steps; 0: only at the end and on a "
        "stop signal (default: %(default)s)",
    )
    g.add_argument(
        "--keep-checkpoints",
        type=int,
        default=d.keep_checkpoints,
        metavar="K",
        help="keep the K newest checkpoints, 0 keeps all (default: %(default)s)",
    )
    g.add_argument(
        "--resume",
        nargs="?",
        const=RESUME_LATEST,
        metavar="PATH",
        help="continue from checkpoint PATH, or without PATH (or with 'latest') from the "
        "newest in --checkpoint-dir, starting fresh if there is none yet; --epochs and "
        "--max-steps count from step 0; this run's --lr and --momentum apply",
    )
    g.add_argument(
        "--stop-check-every",
        type=int,
        metavar="N",
        help="steps between the ranks' checks for a stop signal (default: adaptive, "
        "about every 0.25 s of training and at least every step)",
    )
    g = p.add_argument_group("reporting")
    g.add_argument(
        "--log-every",
        type=int,
        metavar="N",
        help="progress line every N steps (default: about 10 lines per run)",
    )
    g.add_argument(
        "--metrics",
        metavar="FILE",
        help="append JSON lines (step, epoch, rank, loss, rank_loss, samples_per_s, "
        "step_time_s, data_wait_s, data_wait_share, lr, time) at every progress "
        "line; with {rank} in FILE every rank writes its own file, else rank 0 only",
    )
    g.add_argument(
        "--no-eval",
        dest="evaluate",
        action="store_false",
        help="skip the test-split accuracy at the end",
    )
    g = p.add_argument_group("distributed (without torchrun)")
    g.add_argument(
        "--init-method",
        metavar="URL",
        help="tcp://HOST:PORT or file:///shared/path; needs --rank and --world-size",
    )
    g.add_argument("--rank", type=int, help="this process's rank, with --init-method")
    g.add_argument("--world-size", type=int, help="number of processes, with --init-method")
    g.add_argument(
        "--local-rank",
        type=int,
        metavar="L",
        help="this process's index among the ranks on its node, with --init-method "
        "(default: LOCAL_RANK if set, else derived from the ranks' host names)",
    )
    g.add_argument(
        "--local-world-size",
        type=int,
        metavar="N",
        help="ranks on this node, with --init-method (default: LOCAL_WORLD_SIZE if set, "
        "else derived from the ranks' host names)",
    )
    g.add_argument(
        "--timeout",
        dest="timeout_s",
        type=float,
        default=d.timeout_s,
        metavar="SECONDS",
        help="longest wait for the other ranks in the rendezvous or any collective "
        "before exiting 1 (default: %(default)g)",
    )
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        model=args.model,
        dataset=args.dataset,
        data_path=args.data_path,
        synthetic_samples=args.synthetic_samples,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        global_batch=args.global_batch,
        epochs=args.epochs,
        max_steps=args.max_steps,
        lr=args.lr,
        momentum=args.momentum,
        seed=args.seed,
        precision=args.precision,
        device=args.device,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        resume=args.resume,
        metrics=args.metrics,
        log_every=args.log_every,
        stop_check_every=args.stop_check_every,
        evaluate=args.evaluate,
        cuda_graphs=args.cuda_graphs,
        timeout_s=args.timeout_s,
    )


def main(argv: list[str] | None = None) -> int:
    started_at = time.perf_counter()
    # The launcher reads each rank's output from files line by line.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        topology = resolve_topology(
            os.environ,
            args.init_method,
            args.rank,
            args.world_size,
            args.local_rank,
            args.local_world_size,
        )
        from orchestrator.trainer.loop import run  # imports torch: only for valid input

        return run(config, topology, started_at)
    except TrainerUsageError as exc:
        emit(f"{PROG}: error: {exc}", sys.stderr)
        return EXIT_USAGE
    except TrainerRuntimeError as exc:
        emit(f"{PROG}: error: {exc}", sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        emit(f"{PROG}: interrupted", sys.stderr)
        return EXIT_INTERRUPTED
