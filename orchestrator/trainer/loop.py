"""The training loop: accumulation that matches DDP, reports, checkpoints, agreed stops.

With ``ORCHESTRATOR_METRICS_FILE`` set, every rank also appends its own timing records
there (channel.py): the loop times its waits in collectives (DDP's gradient all-reduce,
the stop check, the report's loss sum, the checkpoint's RNG gather) so a record can
split each step into this rank's own work and its wait for the others.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from orchestrator.trainer.batching import BatchFeeder
from orchestrator.trainer.checkpoint import (
    FORMAT,
    capture_rng_state,
    remove_stale_temporaries,
    save_checkpoint,
    save_final_model,
)
from orchestrator.trainer.config import Topology, TrainConfig
from orchestrator.trainer.datasets import Split
from orchestrator.trainer.distributed import Runtime, is_peer_failure, start_runtime
from orchestrator.trainer.exits import EXIT_OK, TrainerRuntimeError
from orchestrator.trainer.gradients import ExactGradients, block_loss
from orchestrator.trainer.graphs import applies, graph_module
from orchestrator.trainer.models import parameter_count
from orchestrator.trainer.reporting import (
    WindowStats,
    emit,
    progress_line,
    reported_at,
    summary_line,
)
from orchestrator.trainer.setup import Session, build_session
from orchestrator.trainer.signals import StopAgreement, StopRequest, signal_name

EVAL_BATCH = 1024


def run(config: TrainConfig, topology: Topology, started_at: float) -> int:
    """Train as configured; returns the process exit code (0, or 128+signal after a stop)."""
    runtime = start_runtime(topology, config.device, config.timeout_s)
    peer_lost = False
    try:
        _announce(runtime)
        session = build_session(config, runtime)
        try:
            return Trainer(session, started_at).train()
        finally:
            session.close()
    except RuntimeError as exc:
        if not (runtime.distributed and is_peer_failure(exc)):
            raise
        peer_lost = True
        raise TrainerRuntimeError(_peer_lost(runtime, exc, config.timeout_s)) from None
    finally:
        # With a peer gone, tearing the group down could wait on it again; the process
        # is about to exit, which frees everything anyway.
        if not peer_lost:
            runtime.shutdown()


def _peer_lost(rt: Runtime, exc: BaseException, timeout_s: float) -> str:
    reason = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
    # Without gloo's source location and its generic advice.
    reason = reason.split("] ", 1)[-1].split(". ", 1)[0][:160]
    return (
        f"rank {rt.rank} of {rt.world_size}: lost contact with the other ranks ({reason}); "
        f"a peer rank exited, or did not answer within --timeout {timeout_s:g} s: its own "
        "output says why"
    )


def _announce(rt: Runtime) -> None:
    """Every rank's one line: enough to match a log file to a process and a device."""
    emit(
        f"rank {rt.rank}/{rt.world_size} started: pid {os.getpid()}, {rt.device_info}, "
        f"{rt.backend or 'no process group'}, {rt.threads} thread(s)"
    )


def _cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The plain state_dict on CPU, so the file loads on machines without a GPU."""
    return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}


@dataclass
class Window:
    """Accumulators for the steps since the last progress line."""

    start: float = field(default_factory=time.perf_counter)
    steps: int = 0
    data_s: float = 0.0


class Trainer:
    def __init__(self, session: Session, started_at: float) -> None:
        self.s = session
        self.config = session.config
        self.runtime = session.runtime
        self.started_at = started_at
        # Before DDP wraps it: DDP's hooks sit on the parameters, which stay the same.
        self.graphed = self._graph(session)
        self.ddp: DistributedDataParallel | None = None
        if self.runtime.distributed:
            device = self.runtime.device
            self.ddp = DistributedDataParallel(
                session.model,
                device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=True,
            )
        # Gradients summed exactly over blocks and ranks (gradients.py), so that every
        # world trains the same model bit for bit; the hook replaces DDP's average.
        self.exact = ExactGradients(session.model.parameters())
        if self.ddp is not None:
            self.ddp.register_comm_hook(self.ddp.process_group, self.exact.hook)
        self.model: nn.Module = self.ddp if self.ddp is not None else session.model
        self.channel = session.channel
        # Waits in collectives are timed only where there are collectives: alone, sync_s is 0.
        self.sync_meter = self.channel if self.ddp is not None else None
        if self.sync_meter is not None:
            self.sync_meter.watch_gradients(session.model)
        self.last_loss = session.resumed_loss if session.resumed_loss is not None else math.nan
        self.last_saved_step = -1

    def _graph(self, s: Session) -> bool:
        """Replay the model's step as CUDA graphs where that applies (graphs.py)."""
        rt, cfg = self.runtime, self.config
        if not applies(cfg.cuda_graphs, rt.device, s.split.most_micro_steps):
            return False
        first = s.split.micro_batches(rt.rank)[0]
        indices = s.plan.global_indices(s.start_step)[first.start : first.start + first.count]
        sample, _ = s.feeder.fetch(indices)
        s.model.train()
        s.model, failed = graph_module(s.model, sample, s.autocast)
        if failed is not None:
            emit(f"rank {rt.rank}: {failed}")
        return failed is None

    def say(self, line: str) -> None:
        if self.runtime.is_main:
            emit(line)

    def _header(self) -> None:
        s, rt, cfg = self.s, self.runtime, self.config
        spe = s.plan.steps_per_epoch
        self.say(
            f"trainer: {cfg.model} ({parameter_count(s.model):,} params) on "
            f"{s.dataset.describe()}; {s.split.describe()}; {s.total_steps} steps "
            f"({spe}/epoch); sgd lr {cfg.lr} momentum {cfg.momentum}; {cfg.precision}"
            + (", CUDA graphs" if self.graphed else "")
        )
        if s.resumed_from is not None:
            epoch, within = s.plan.position(s.start_step)
            self.say(
                f"resumed from {s.resumed_from} at step {s.start_step} "
                f"(epoch {epoch + 1}, step {within} of {spe})"
            )
        if rt.is_main and cfg.checkpoint_dir is not None:
            for stale in remove_stale_temporaries(cfg.checkpoint_dir):
                self.say(f"removed {stale}, left by an interrupted save")

    # -- the loop --------------------------------------------------------------

    def train(self) -> int:
        self._header()
        # Armed only now: until here SIGTERM/SIGUSR1 keep their default action and end
        # the process at once, which is right while there is nothing to save and a
        # rank may be stuck waiting for peers that never come.
        stop = StopRequest()
        try:
            return self._train(stop)
        finally:
            stop.restore()

    def _train(self, stop: StopRequest) -> int:
        s, rt, cfg = self.s, self.runtime, self.config
        log_every = cfg.log_every or max(1, s.total_steps // 10)
        micro_batches = s.split.micro_batches(rt.rank)
        last_micro = len(micro_batches) - 1
        agreement = StopAgreement(rt, stop, cfg.stop_check_every)
        # Micro-batch loss sums since the last report, left on the device so no step
        # waits for a GPU->CPU copy; summed and read only when reporting.
        losses: list[torch.Tensor] = []
        global_batch, exact = s.plan.global_batch, self.exact
        channel, meter = self.channel, self.sync_meter
        train_start = time.perf_counter()
        window, data_total = Window(train_start), 0.0
        completed = s.start_step
        if channel is not None:
            channel.start(train_start, completed)
            if rt.is_main:
                channel.began(completed)
        self.model.train()
        for step in range(s.start_step, s.total_steps):
            global_indices = s.plan.global_indices(step)
            for micro, part in enumerate(micro_batches):
                t0 = time.perf_counter()
                x, y = s.feeder.fetch(global_indices[part.start : part.start + part.count])
                window.data_s += time.perf_counter() - t0
                # Gradients are all-reduced only on the last micro-step. Each block's
                # loss is its samples' sum divided by G, the same on every world, and
                # the blocks' gradients are summed exactly (gradients.py): the mean
                # gradient over the whole global batch, the launch's bit for bit.
                last = micro == last_micro
                sync = self.ddp.no_sync() if self.ddp is not None and not last else nullcontext()
                with sync:
                    with s.autocast():
                        loss, scaled = block_loss(self.model(x), y, global_batch)
                    (s.scaler.scale(scaled) if s.scaler is not None else scaled).backward()
                if not last:
                    exact.hold()
                if meter is not None and last:
                    meter.waited(meter.grad_ready)  # DDP's all-reduce, after the computation
                loss = loss.detach()
                losses.append(loss)
                if channel is not None and part.count:
                    channel.losses.append(loss / part.count)
            if self.ddp is None:
                exact.finish_alone()
            else:
                exact.reduced()
            if s.scaler is not None:
                s.scaler.step(s.optimizer)
                s.scaler.update()
            else:
                s.optimizer.step()
            s.optimizer.zero_grad(set_to_none=True)
            completed = step + 1
            window.steps += 1

            waiting = time.perf_counter() if meter is not None else 0.0
            signum = agreement.poll(completed)
            if meter is not None:
                meter.waited(waiting)
            if reported_at(completed, log_every, s.total_steps, bool(signum)):
                loss_sum = torch.stack(losses).sum()
                self._report(completed, window, loss_sum)
                data_total += window.data_s
                losses.clear()
                window = Window()
            # Each rank on its own clock: a record must never line the ranks up.
            if channel is not None:
                channel.after_step(
                    completed,
                    data_total + window.data_s,
                    log_every=log_every,
                    total_steps=s.total_steps,
                    stopped=bool(signum),
                )
            if signum:
                return self._stopped(completed, signum, stop.at)
            if cfg.checkpoint_every and completed % cfg.checkpoint_every == 0:
                self._checkpoint(completed)
        agreement.close()
        data_total += window.data_s
        return self._finish(completed, time.perf_counter() - train_start, data_total)

    def _report(self, completed: int, window: Window, loss_sum: torch.Tensor) -> None:
        """Sum the window's loss over ranks (the only per-window sync) and report it.

        ``loss_sum`` is the sum of this rank's per-sample losses over the window, so the
        means are per sample also where ranks and micro-batches differ in size.
        """
        rt, plan = self.runtime, self.s.plan
        own_samples = window.steps * self.s.split.samples(rt.rank)
        # Read before the in-place all-reduce; a rank with no samples has no loss.
        rank_loss = loss_sum.item() / own_samples if own_samples else math.nan
        waiting = time.perf_counter()
        global_loss = rt.all_reduce_sum(loss_sum).item() / (window.steps * plan.global_batch)
        if self.sync_meter is not None:
            self.sync_meter.waited(waiting)
        wall = time.perf_counter() - window.start
        stats = WindowStats(
            step=completed,
            total_steps=self.s.total_steps,
            epoch=(completed - 1) // plan.steps_per_epoch + 1,
            epochs=math.ceil(self.s.total_steps / plan.steps_per_epoch),
            loss=global_loss,
            rank_loss=rank_loss,
            samples_per_s=window.steps * plan.global_batch / wall,
            step_time_s=wall / window.steps,
            data_wait_s=window.data_s / window.steps,
        )
        self.say(progress_line(stats))
        self.s.metrics.write(stats, self.s.optimizer.param_groups[0]["lr"])
        self.last_loss = global_loss

    # -- checkpoints and endings -----------------------------------------------

    def _checkpoint(self, completed: int) -> Path | None:
        """Save the full state after ``completed`` steps (collective: every rank calls it)."""
        directory = self.config.checkpoint_dir
        if directory is None or completed == self.last_saved_step:
            return None
        saving = time.time()
        # Each rank's RNG state, so a resume with the same world size restores them all.
        own_rng = capture_rng_state()
        waiting = time.perf_counter()
        rng = self.runtime.all_gather_objects(own_rng)
        if self.sync_meter is not None:
            self.sync_meter.waited(waiting)
        self.last_saved_step = completed
        if not self.runtime.is_main:
            return None
        s = self.s
        epoch, within = s.plan.position(completed)
        state = {
            "format": FORMAT,
            "step": completed,
            "epoch": epoch,  # 0-based, like step_in_epoch
            "step_in_epoch": within,
            "model": _cpu_state(s.model),
            "optimizer": s.optimizer.state_dict(),
            "scaler": s.scaler.state_dict() if s.scaler is not None else None,
            "rng": rng,
            "run": s.identity,
            "loss": self.last_loss,
            "split": {
                "world_size": self.runtime.world_size,
                "batch_size": self.config.batch_size,
                "grad_accum": s.split.most_micro_steps,
                "launch_world_size": s.split.launch_world_size,
            },
        }
        path = save_checkpoint(directory, state, self.config.keep_checkpoints)
        if self.channel is not None:
            self.channel.checkpointed(completed, time.time() - saving)
        return path

    def _stopped(self, completed: int, signum: int, signalled_at: float) -> int:
        saving = time.monotonic()
        path = self._checkpoint(completed)
        done = time.monotonic()
        name = signal_name(signum)
        if self.runtime.is_main:
            # How long a warning must come ahead of a time limit (--signal): the agreed
            # stop (on this rank's clock, from its own signal) and the save.
            saved = (
                "no --checkpoint-dir, so nothing was saved"
                if self.config.checkpoint_dir is None
                else f"checkpoint saved to {path or self.config.checkpoint_dir} in "
                f"{done - saving:.2f} s, {done - signalled_at:.2f} s after the signal; "
                "continue with --resume"
            )
            emit(f"stopped by {name} after step {completed}/{self.s.total_steps}; {saved}")
        else:
            emit(f"rank {self.runtime.rank}: stopped by {name} after step {completed}")
        # Nobody exits before rank 0's checkpoint is on disk: under torchrun, the first
        # rank to exit non-zero gets the others killed.
        self.runtime.barrier()
        return 128 + signum

    def _finish(self, completed: int, train_s: float, data_s: float) -> int:
        s, rt, cfg = self.s, self.runtime, self.config
        test = s.dataset.test if cfg.evaluate else None
        accuracy = self._evaluate(test) if test is not None else None
        self._checkpoint(completed)
        if rt.is_main and cfg.checkpoint_dir is not None:
            save_final_model(cfg.checkpoint_dir, _cpu_state(s.model))
        steps = completed - s.start_step
        self.say(
            summary_line(
                steps=completed,
                final_loss=self.last_loss,
                test_accuracy=accuracy,
                samples_per_s=steps * s.plan.global_batch / train_s if steps else 0.0,
                data_wait_share=data_s / train_s if steps else 0.0,
                train_s=train_s,
                total_s=time.perf_counter() - self.started_at,
            )
        )
        rt.barrier()
        return EXIT_OK

    @torch.no_grad()
    def _evaluate(self, test: Split) -> float:
        """Accuracy on the test split; rank r scores samples r, r + W, r + 2W, ..."""
        s, rt = self.s, self.runtime
        s.model.eval()
        feeder = BatchFeeder(test, rt.device, s.feeder.transform)
        correct = torch.zeros((), device=rt.device, dtype=torch.long)
        for chunk in torch.arange(rt.rank, len(test), rt.world_size).split(EVAL_BATCH):
            x, y = feeder.fetch(chunk)
            with s.autocast():
                correct += (s.model(x).argmax(dim=1) == y).sum()
        s.model.train()
        return rt.all_reduce_sum(correct).item() / len(test)
