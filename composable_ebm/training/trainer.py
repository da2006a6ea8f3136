"""The training loop: data, optimiser, schedule, EMA, faults, checkpoints and logging, around one objective.

The model's family decides the objective: contrastive divergence, Algorithm 1 of Du et al. 2021
(`composable_ebm.training.contrastive`: chains from a replay buffer and the KL loss), for a model of clean data;
denoising score matching (`composable_ebm.training.denoising`: no chain, nothing kept) for a noise-conditioned
one. An objective runs an iteration up to its backward pass and keeps its own state (the buffer); the loop draws the
positives, applies Adam and the EMA once the iteration's statistics show no fault, and saves everything.

The loop's other parts: `composable_ebm.training.config` (settings), `...state` (checkpoint and resume),
`...faults` and `...record` (the typed per-step record the log, plots and the CLI read).

Health: every iteration checks the loss and the energies; a non-finite value or an exploding difference is reported
with its step and, by default, training rolls back to the last good checkpoint with a new seed. NaNs are never
replaced.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from composable_ebm.accel.settings import Speed
from composable_ebm.atomic import remove_stale_temporaries
from composable_ebm.energy import NULL, Energy
from composable_ebm.errors import InvalidInputError
from composable_ebm.images import as_float_images
from composable_ebm.sampling import augment
from composable_ebm.training.buffer import ReplayBuffer
from composable_ebm.training.config import ContrastiveConfig, TrainerConfig, TrainingData, learning_rate
from composable_ebm.training.contrastive import ContrastiveDivergence, ImprovedCDObjective, ObjectiveOutput
from composable_ebm.training.denoising import DenoisingScoreMatching
from composable_ebm.training.faults import Fault, TrainingDiverged, raise_if_any_rank_faulted
from composable_ebm.training.lock import RunLock
from composable_ebm.training.log import LOG_NAME, RunLog
from composable_ebm.training.posthoc import PowerAverages
from composable_ebm.training.loop import Objective
from composable_ebm.training.record import StepRecord
from composable_ebm.training.state import TrainingState

__all__ = ["ImprovedCDObjective", "ObjectiveOutput", "Objective", "StepRecord", "Trainer", "TrainerConfig",
           "TrainingData", "TrainingSummary", "init_distributed"]


@dataclass
class TrainingSummary:
    steps: int
    rollbacks: int
    faults: list[dict[str, Any]]
    seconds_per_step: float
    stopped: bool = False  # fit returned before its last step (should_stop)


class Trainer(TrainingState):
    """The training loop for any `Energy` (conditional or not) on in-memory data, with the objective of the model's
    family (the module's docstring).

    Args:
        energy: the model to train (moved to ``device``).
        data: a `TrainingData` (images and labels) or a plain tensor of images.
        config: training settings; its ``objective`` (None: the family's defaults) must be the model family's.
        out_dir: where ``checkpoint.pt``, ``log.jsonl`` (and TensorBoard files) go; ``None``:
            keep the rollback checkpoint in memory and write nothing.
        device: training device (default: the model's).
        speed: what the run may do to go faster (default: `Speed.from_environment`, read now).
    """

    LOG = LOG_NAME

    def __init__(
        self,
        energy: Energy,
        data: TrainingData | Tensor,
        config: TrainerConfig,
        out_dir: str | Path | None = None,
        device: torch.device | str | None = None,
        speed: Speed | None = None,
    ) -> None:
        self.config = config = config.for_model(energy.noise_conditioned)
        self.speed = speed if speed is not None else Speed.from_environment()
        self.device = torch.device(device) if device is not None else energy.device
        if self.device.type == "cuda" and self.device.index is None:  # the current GPU (torchrun: LOCAL_RANK's)
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.energy = energy.to(self.device)
        self.images, self.labels = self._check_data(energy, data)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        # the objective first: under DDP, wrapping its loss broadcasts rank 0's parameters, which the EMA then copies
        self.objective: Objective = (ContrastiveDivergence(self, config.objective)
                                     if isinstance(config.objective, ContrastiveConfig)
                                     else DenoisingScoreMatching(self, config.objective))
        self.optimizer = torch.optim.Adam(self.energy.parameters(), lr=config.lr, betas=config.betas)
        self.ema = copy.deepcopy(self.energy).requires_grad_(False).eval()
        self.posthoc = PowerAverages(self.energy, config.posthoc_ema) if config.posthoc_ema else None
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(self._seed(0))
        self.step = 0
        self.resumed_exactly = True  # False after a resume from a checkpoint of another kind of device
        self._fit_total = -1  # the step count fit() trains to (its last step is always logged)
        self.rollbacks = 0
        self.faults: list[dict[str, Any]] = []
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self._memory_checkpoint: dict[str, Any] | None = None
        self._has_own_checkpoint = False  # rollbacks only ever return to states of this run
        self.log: RunLog | None = None
        self.lock: RunLock | None = None
        if self.out_dir is not None and self.rank == 0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.lock = RunLock(self.out_dir)  # refuses a folder another live run trains into
            remove_stale_temporaries(self.out_dir / self.CHECKPOINT)  # left by a run killed mid-write
            self.log = RunLog(self.out_dir)

    @property
    def buffer(self) -> ReplayBuffer:
        """The replay buffer of a contrastive-divergence run (`ContrastiveDivergence.buffer`)."""
        if not isinstance(self.objective, ContrastiveDivergence):
            raise AttributeError("a denoising run keeps no replay buffer; only contrastive divergence has one")
        return self.objective.buffer

    def parallel(self, loss: nn.Module) -> nn.Module:
        """``loss`` as the objective runs it: wrapped for DDP in a distributed run (one forward per step sees every
        parameter-gradient path), as it is otherwise."""
        if not self.distributed:
            return loss
        return nn.parallel.DistributedDataParallel(
            loss, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def close(self) -> None:
        """Release the run folder (also done when the process exits)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # ------------------------------------------------------------------ setup
    def _seed(self, rollbacks: int) -> int:
        return self.config.seed + 1_000_003 * rollbacks + 7_919 * self.rank

    def _check_data(self, energy: Energy, data: TrainingData | Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        images = data if isinstance(data, Tensor) else data.images
        labels = {} if isinstance(data, Tensor) else dict(data.labels)
        if tuple(images.shape[1:]) != energy.input_shape:
            raise ValueError(f"data items have shape {tuple(images.shape[1:])}, the energy expects {energy.input_shape}")
        missing = set(energy.attributes) - set(labels)
        if missing:
            raise ValueError(f"the energy is conditioned on {sorted(energy.attributes)} but the data has no labels for {sorted(missing)}")
        labels = {a: labels[a].to(self.device).long() for a in energy.attributes}
        if images.device.type == "cpu" and self.device.type == "cuda":
            images = images.pin_memory()  # kept on the host (uint8 stays uint8): only each batch moves
        return images, labels

    # ------------------------------------------------------------ one iteration
    def draw_images(self, n: int) -> tuple[Tensor, Tensor]:
        """``n`` training images drawn uniformly with replacement (float, on the device), and their indices.

        The data stays where it was given (on the host, as uint8 when it is stored so); only the batch moves."""
        idx = torch.randint(self.images.shape[0], (n,), generator=self.generator, device=self.device)
        batch = self.images[idx.to(self.images.device)].to(self.device, non_blocking=True)
        return as_float_images(batch), idx

    def positives(self, n: int) -> tuple[Tensor, dict[str, Tensor]]:
        """``n`` positives: training images augmented (``data_augment``) and dequantized, with their labels, a share
        ``label_dropout`` of them under the null condition."""
        x, idx = self.draw_images(n)
        if self.config.data_augment is not None:
            x = augment(x, self.config.data_augment, self.generator)
        if self.config.dequantize and self.energy.value_range == (0.0, 1.0):
            x = x * (255.0 / 256.0) + torch.rand(x.shape, generator=self.generator, device=self.device) / 256.0
        labels = {a: v[idx] for a, v in self.labels.items()}
        if self.config.label_dropout > 0 and labels:  # the null condition: every attribute unbound at once
            drop = torch.rand(n, generator=self.generator, device=self.device) < self.config.label_dropout
            labels = {a: torch.where(drop, torch.full_like(v, NULL), v) for a, v in labels.items()}
        return x, labels

    def logs_this_step(self) -> bool:
        """Whether the iteration in progress is logged (every ``log_every``-th, and a run's last)."""
        return (self.step + 1) % self.config.log_every == 0 or self.step + 1 == self._fit_total

    def train_step(self) -> StepRecord:
        """One iteration of the objective, applied; returns its statistics (raises `Fault` on a fault)."""
        t0 = time.perf_counter()
        record = self.objective.step()
        self._update(record)
        self.objective.applied()
        self.step += 1
        record.seconds = time.perf_counter() - t0
        record.images_per_second = self.config.batch_size * self.world_size / record.seconds
        return record

    def backward(self, loss: Tensor) -> Tensor:
        """Backward and clip; returns the gradient norm before clipping, on the device (nothing is read back)."""
        params = [p for p in self.energy.parameters() if p.requires_grad]
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.grad_clip is not None:
            return nn.utils.clip_grad_norm_(params, self.config.grad_clip)
        return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))

    def _update(self, record: StepRecord) -> None:
        """Adam and the EMA, once ``record``'s statistics show no fault (`fault_reason`, a non-finite gradient norm:
        `Fault`, and the backward pass's gradients are left unused)."""
        raise_if_any_rank_faulted(self.objective.fault(record), self.device)
        if not math.isfinite(record.grad_norm):
            raise Fault(f"non-finite gradient norm {record.grad_norm}")
        run_steps = self._fit_total if self._fit_total > 0 else self.config.steps  # outside fit: the config's steps
        record.lr = learning_rate(self.config, self.step, run_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = record.lr
        self.optimizer.step()
        self._update_ema()
        if self.posthoc is not None:
            self.posthoc.update(self.energy, self.step + 1)

    @torch.no_grad()
    def _update_ema(self) -> None:
        decay = self.config.ema_decay
        if self.config.ema_warmup:  # bias-free early average (as TensorFlow's ExponentialMovingAverage)
            decay = min(decay, (1.0 + self.step) / (10.0 + self.step))
        torch._foreach_lerp_(list(self.ema.parameters()), [p.detach() for p in self.energy.parameters()], 1.0 - decay)
        for e, b in zip(self.ema.buffers(), self.energy.buffers(), strict=True):
            e.copy_(b)

    def write_posthoc(self) -> None:
        """Write the post-hoc averages of this step to ``out_dir/ema/`` (rank 0; nothing without ``out_dir``)."""
        if self.out_dir is not None and self.rank == 0:
            self.posthoc.write(self.energy, self.out_dir, self.step)

    # ----------------------------------------------------------------- the loop
    def fit(
        self, steps: int | None = None, callback: Callable[[int, StepRecord], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> TrainingSummary:
        """Train until ``steps`` iterations in total (default: ``config.steps``), resuming counts.

        ``callback(step, record)`` runs after every successful iteration (e.g. a progress bar).
        ``should_stop()`` is asked after every iteration: when it says so, the state is checkpointed and training
        returns early (``TrainingSummary.stopped``), so a signal or a time limit loses no finished step.
        """
        total = self.config.steps if steps is None else steps
        self._fit_total = total
        if not self._has_own_checkpoint:
            # the state to roll back to before the first good checkpoint; it replaces any older run's
            # checkpoint in out_dir, so a fault never rolls back into another run
            self.save_checkpoint()
        t_start, start_step = time.perf_counter(), self.step
        while self.step < total:
            try:
                record = self.train_step()
            except Fault as fault:
                self._handle_fault(self.step + 1, fault.reason)
                continue
            if callback is not None:
                callback(self.step, record)
            if self.step % self.config.log_every == 0 or self.step == total:  # the last step too, so a short run can be plotted
                self._log({"step": self.step, **record.to_log(**self.objective.log_fields(), rollbacks=self.rollbacks)})
            stop = should_stop is not None and self.step < total and should_stop()
            if self.posthoc is not None and (self.step % self.config.posthoc_every == 0 or self.step == total or stop):
                self.write_posthoc()
            if self.step % self.config.checkpoint_every == 0 or self.step == total or stop:
                self.save_checkpoint()
            if stop:
                self._log({"event": "stopped", "step": self.step})
                break
        done = self.step - start_step
        return TrainingSummary(self.step, self.rollbacks, self.faults, (time.perf_counter() - t_start) / max(done, 1),
                               stopped=self.step < total)

    def _handle_fault(self, step: int, reason: str) -> None:
        """Stop, or roll back to the last checkpoint with a new seed; the fault is logged once, after the
        log is cut back to the step training returns to."""
        event = {"event": "fault", "step": step, "reason": reason}
        stop = self.config.on_fault == "stop" or self.rollbacks >= self.config.max_rollbacks
        event["action"] = "stop" if stop else "rollback"
        self.faults.append(event)
        if stop:
            self._log(event)
            raise TrainingDiverged(step, reason)
        self.rollbacks += 1
        rollbacks = self.rollbacks
        self._restore(self._latest_checkpoint())
        self.rollbacks = rollbacks
        self.generator.manual_seed(self._seed(rollbacks))  # a new seed, so the same fault is not replayed
        if self.log is not None:  # the steps after the checkpoint will be redone: drop their records
            self.log.truncate(self.step)
        self._log(event)
        self._log({"event": "rolled_back", "to_step": self.step, "rollbacks": rollbacks})

    # ----------------------------------------------------------------- logging
    def _log(self, record: dict[str, Any]) -> None:
        if self.log is not None:
            self.log.append(record)


def init_distributed(device: torch.device | str | None = None) -> bool:
    """Initialise torch.distributed from torchrun's environment variables; returns whether it did.

    The backend follows the device the run trains on (``device``; default: CUDA if available):
    NCCL on CUDA, each process on the GPU its ``LOCAL_RANK`` names, and gloo on the CPU.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.is_initialized()
    kind = torch.device(device).type if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    backend = "nccl" if kind == "cuda" else "gloo"
    if backend == "nccl":
        local_rank, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if local_rank >= count:
            raise InvalidInputError(f"torchrun process {local_rank} of this node has no GPU of its own ({count} CUDA"
                                    f" device(s) here); valid choices: --nproc_per_node <= {count}, or --device cpu")
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=backend, init_method="env://")
    return True
