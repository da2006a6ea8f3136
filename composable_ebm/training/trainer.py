"""The trainer: Algorithm 1 of Du et al. 2021 ("EBM training algorithm"), and denoising score matching for
noise-conditioned energies (`composable_ebm.training.denoising`: no chain, no buffer), chosen by the model.

Per iteration: positives from the data; chain starts from the replay buffer (fresh uniform
noise with probability ``reinit_prob``), augmented; ``K - 1`` Langevin steps without
parameter gradients; the last step inside `ImprovedCDObjective`, which builds the
graph the KL loss needs (so the last step is computed once); ``L_CD + L_KL``; Adam; EMA;
the new negatives go into the buffer.

The trainer's parts: `composable_ebm.training.config` (settings), `...objective` (the loss, with
the last Langevin step), `...state` (checkpoint and resume), `...faults` and `...record` (the typed
per-step record the log, plots and the CLI read); this module is the loop.

Health: every iteration checks the loss and the energy difference; a non-finite value or an
exploding difference is reported with its step and, by default, training rolls back to the
last good checkpoint with a new seed. NaNs are never replaced.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from composable_ebm.atomic import remove_stale_temporaries
from composable_ebm.configs import MAX_BUFFER_ELEMENTS
from composable_ebm.energy import NULL, Energy
from composable_ebm.errors import InvalidInputError
from composable_ebm.images import as_float_images
from composable_ebm.sampling import augment, initial_noise, run_chain
from composable_ebm.sampling.graphs import capture
from composable_ebm.sampling.graphs import enabled as graphs_enabled
from composable_ebm.training.buffer import ReplayBuffer
from composable_ebm.training.config import TrainerConfig, TrainingData, learning_rate
from composable_ebm.training.denoising import DenoisingObjective, DenoisingOutput
from composable_ebm.training.faults import Fault, TrainingDiverged, fault_reason, raise_if_any_rank_faulted
from composable_ebm.training.lock import RunLock
from composable_ebm.training.log import LOG_NAME, RunLog
from composable_ebm.training.losses import other_values
from composable_ebm.training.objective import ImprovedCDObjective, ObjectiveOutput
from composable_ebm.training.precision import network_precision
from composable_ebm.training.record import StepRecord
from composable_ebm.training.state import TrainingState

MAX_GRAPHED_DATA_BYTES = 1 << 31
"""training data larger than this (2 GiB) stays on the host, and a denoising iteration runs without a CUDA graph"""

__all__ = ["ImprovedCDObjective", "ObjectiveOutput", "StepRecord", "Trainer", "TrainerConfig", "TrainingData",
           "TrainingSummary", "init_distributed"]


@dataclass
class TrainingSummary:
    steps: int
    rollbacks: int
    faults: list[dict[str, Any]]
    seconds_per_step: float
    stopped: bool = False  # fit returned before its last step (should_stop)


class Trainer(TrainingState):
    """Algorithm 1 for any `Energy` (conditional or not) on in-memory data.

    Args:
        energy: the model to train (moved to ``device``).
        data: a `TrainingData` (images and labels) or a plain tensor of images.
        config: training settings.
        out_dir: where ``checkpoint.pt``, ``log.jsonl`` (and TensorBoard files) go; ``None``:
            keep the rollback checkpoint in memory and write nothing.
        device: training device (default: the model's).
    """

    LOG = LOG_NAME

    def __init__(
        self,
        energy: Energy,
        data: TrainingData | Tensor,
        config: TrainerConfig,
        out_dir: str | Path | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        self.config = config
        self.device = torch.device(device) if device is not None else energy.device
        if self.device.type == "cuda" and self.device.index is None:  # the current GPU (torchrun: LOCAL_RANK's)
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.energy = energy.to(self.device)
        self.images, self.labels = self._check_data(energy, data)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.denoising = energy.noise_conditioned
        if config.precision != "float32" and not self.denoising:
            raise InvalidInputError(
                f"TrainerConfig.precision {config.precision!r} sets the denoising loss of a noise-conditioned model;"
                " a contrastive-divergence chain's arithmetic is [trainer.sampler] precision (valid: float32, bfloat16)")
        self.objective: nn.Module = (DenoisingObjective(self.energy, config.loss_weighting) if self.denoising
                                     else ImprovedCDObjective(self.energy, config))
        if self.distributed:
            self.objective = nn.parallel.DistributedDataParallel(
                self.objective, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        self.optimizer = torch.optim.Adam(self.energy.parameters(), lr=config.lr, betas=config.betas)
        self.ema = copy.deepcopy(self.energy).requires_grad_(False).eval()
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(self._seed(0))
        elements = config.buffer_size * math.prod(energy.input_shape)
        if elements > MAX_BUFFER_ELEMENTS:
            raise InvalidInputError(
                f"TrainerConfig.buffer_size {config.buffer_size:,} of inputs {tuple(energy.input_shape)} is {elements:,}"
                f" elements ({4 * elements / 2**30:,.1f} GiB in float32); at most {MAX_BUFFER_ELEMENTS:,} (8 GiB)")
        self.buffer = ReplayBuffer(
            1 if self.denoising else config.buffer_size,  # denoising keeps no negatives
            energy.input_shape, sorted(energy.attributes), self.device, config.buffer_policy,
        )
        self._step_graph: tuple[torch.cuda.CUDAGraph, Tensor, list[Tensor | None]] | None = None
        self._graph_failed = False  # a capture of the training step failed: it runs eagerly from then on
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
    def _draw_images(self, n: int) -> tuple[Tensor, Tensor]:
        """``n`` training images drawn uniformly with replacement (float, on the device), and their indices.

        The data stays where it was given (on the host, as uint8 when it is stored so); only the batch moves."""
        idx = torch.randint(self.images.shape[0], (n,), generator=self.generator, device=self.device)
        batch = self.images[idx.to(self.images.device)].to(self.device, non_blocking=True)
        return as_float_images(batch), idx

    def _positives(self, n: int) -> tuple[Tensor, dict[str, Tensor]]:
        x, idx = self._draw_images(n)
        if self.config.data_augment is not None:
            x = augment(x, self.config.data_augment, self.generator)
        if self.config.dequantize and self.energy.value_range == (0.0, 1.0):
            x = x * (255.0 / 256.0) + torch.rand(x.shape, generator=self.generator, device=self.device) / 256.0
        labels = {a: v[idx] for a, v in self.labels.items()}
        if self.config.label_dropout > 0 and labels:  # the null condition: every attribute unbound at once
            drop = torch.rand(n, generator=self.generator, device=self.device) < self.config.label_dropout
            labels = {a: torch.where(drop, torch.full_like(v, NULL), v) for a, v in labels.items()}
        return x, labels

    def _chain_starts(self, n: int, pos_labels: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """Chain starts and the labels their chains run under.

        Starts are buffer samples, each through one ``chain_augment`` transition, or fresh uniform noise with
        probability ``reinit_prob`` (never augmented: a crop of noise is smoother noise than sampling starts from).
        Every chain runs under the labels of the positive it is paired with (the authors' Algorithm 1), so the
        label mix of the negatives is the data's and a sample made under one label is often restarted under another.
        """
        sampler = self.config.sampler
        noise = initial_noise(self.energy, n, self.generator, self.device, sampler.init_scale)
        if len(self.buffer) == 0:
            return self._from_data(noise), dict(pos_labels)
        old, _ = self.buffer.sample(n, self.generator)
        fresh = torch.rand(n, generator=self.generator, device=self.device) < self.config.reinit_prob
        if self.config.chain_augment is not None:  # a transition of the chains continued from the buffer only
            old = augment(old, self.config.chain_augment, self.generator)
        shape = (-1,) + (1,) * (noise.ndim - 1)
        return self._from_data(torch.where(fresh.view(shape), noise, old)), dict(pos_labels)

    def _from_data(self, x: Tensor) -> Tensor:
        """Replace each start by an independently drawn training image with probability ``data_start_prob``."""
        p = self.config.data_start_prob
        if p == 0:
            return x
        images, _ = self._draw_images(x.shape[0])
        use = torch.rand(x.shape[0], generator=self.generator, device=self.device) < p
        return torch.where(use.view((-1,) + (1,) * (x.ndim - 1)), images.to(x.dtype), x)

    def train_step(self) -> StepRecord:
        """One iteration of Algorithm 1 (or, for a noise-conditioned model, of denoising score matching); returns
        its statistics (raises `Fault` on a fault)."""
        cfg, s = self.config, self.config.sampler
        t0 = time.perf_counter()
        model = self.energy
        if self.denoising:
            stats = self._replay_denoising() if self._graphable() else None
            loss, e_noised, grad_norm = (self._denoising_stats() if stats is None else stats).tolist()
            record = StepRecord(loss=loss, e_noised=e_noised, grad_norm=grad_norm, loss_dsm=loss)
            self._update(record)
            self.step += 1
            record.seconds = time.perf_counter() - t0
            record.images_per_second = cfg.batch_size * self.world_size / record.seconds
            return record
        x_pos, pos_labels = self._positives(cfg.batch_size)
        x, neg_labels = self._chain_starts(cfg.batch_size, pos_labels)
        labels = neg_labels or None
        if cfg.chain_steps_max is not None:  # this iteration's chain length, from the run's generator (resumable)
            k = int(torch.randint(s.steps, cfg.chain_steps_max + 1, (1,), generator=self.generator, device=self.device))
            s = dataclasses.replace(s, steps=k)
        # every step but the last through the sampler's chain code; the last runs in the objective, once
        x = run_chain(model, x, s, self.generator, labels, num_steps=s.total_steps - 1).x
        bank = None
        if cfg.kl_ent and len(self.buffer) >= max(cfg.ent_min_buffer, 1):
            bank, _ = self.buffer.sample(cfg.ent_bank, self.generator)
        others = other_values(pos_labels, model.attributes, self.generator) if cfg.label_weight and pos_labels else None
        out: ObjectiveOutput = self.objective(x_pos, pos_labels or None, x, labels, self.generator, bank, others)
        logging = (self.step + 1) % cfg.log_every == 0 or self.step + 1 == self._fit_total  # a run logs its last step
        params = [p for p in model.parameters() if p.requires_grad]
        per_term = {}
        if logging:  # gradient norms of L_CD and L_KL separately (the paper's figure of their magnitudes)
            per_term["grad_norm_cd"] = _param_grad_norm(out.cd, params)
            per_term["grad_norm_kl"] = _param_grad_norm(out.kl, params) if out.kl is not None else None
        grad_norm = self._backward(out.loss)
        record = StepRecord(**_read_stats(
            loss=out.loss, loss_cd=out.cd, loss_opt=out.opt, loss_ent=out.ent, loss_label=out.label, e_pos=out.e_pos,
            e_neg=out.e_neg, e_diff=out.e_pos - out.e_neg, langevin_grad_norm=out.langevin_grad_norm,
            grad_norm=grad_norm), **per_term)
        self._update(record)
        self.buffer.add(out.x_neg, neg_labels, self.generator)
        self.step += 1
        record.seconds = time.perf_counter() - t0
        record.images_per_second = cfg.batch_size * self.world_size / record.seconds
        return record

    def _denoising_stats(self) -> Tensor:
        """Positives, the denoising loss, its backward pass and the clip; returns the loss, the noised points' mean
        energy and the gradient norm as one float tensor on the device (nothing is read back)."""
        x_pos, pos_labels = self._positives(self.config.batch_size)
        with network_precision(self.device, self.config.precision):
            noised: DenoisingOutput = self.objective(x_pos, pos_labels or None, self.generator)
        grad_norm = self._backward(noised.loss)
        return torch.stack([noised.loss.detach().float(), noised.energy.float(), grad_norm.float()])

    def _graphable(self) -> bool:
        """Whether this iteration's denoising loss and backward pass replay a CUDA graph (`_replay_denoising`): on
        by default on CUDA (`use_cuda_graphs`), for one process, with training data that fits the device's memory
        budget for it."""
        return (self.device.type == "cuda" and graphs_enabled() and not self.distributed and not self._graph_failed
                and self.images.numel() * self.images.element_size() <= MAX_GRAPHED_DATA_BYTES)

    def _replay_denoising(self) -> Tensor | None:
        """`_denoising_stats` replayed from a CUDA graph (captured at the first call: a denoising iteration is a few
        hundred small kernels, launch-bound on a GPU), or ``None`` where the capture failed: one warning, and
        training goes on eagerly with the generator's draws unchanged.

        The graph draws the batch from a copy of the training data on the device and writes the gradients into
        tensors it owns; they are given back to the parameters after each replay, so Adam reads them as it would
        read an eager backward pass's. Adam, the EMA and the fault check stay outside: a faulted iteration's graph
        has run, but its gradients are never applied."""
        params = [p for p in self.energy.parameters() if p.requires_grad]
        if self._step_graph is None:
            if self.images.device != self.device:
                self.images = self.images.to(self.device)  # the batch is drawn inside the graph
            try:
                graph, stats = capture(self._denoising_stats, self.generator, self.device)
            except RuntimeError as err:
                self._graph_failed = True
                self.optimizer.zero_grad(set_to_none=True)
                warnings.warn(f"CUDA graph capture failed for the training step ({str(err).splitlines()[0]}); it runs"
                              " without graphs", RuntimeWarning, stacklevel=3)
                return None
            self._step_graph = (graph, stats, [p.grad for p in params])
        graph, stats, grads = self._step_graph
        graph.replay()
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        return stats

    def _backward(self, loss: Tensor) -> Tensor:
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
        raise_if_any_rank_faulted(fault_reason(record, self.config.max_energy_diff), self.device)
        if not math.isfinite(record.grad_norm):
            raise Fault(f"non-finite gradient norm {record.grad_norm}")
        run_steps = self._fit_total if self._fit_total > 0 else self.config.steps  # outside fit: the config's steps
        record.lr = learning_rate(self.config, self.step, run_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = record.lr
        self.optimizer.step()
        self._update_ema()

    @torch.no_grad()
    def _update_ema(self) -> None:
        decay = self.config.ema_decay
        if self.config.ema_warmup:  # bias-free early average (as TensorFlow's ExponentialMovingAverage)
            decay = min(decay, (1.0 + self.step) / (10.0 + self.step))
        torch._foreach_lerp_(list(self.ema.parameters()), [p.detach() for p in self.energy.parameters()], 1.0 - decay)
        for e, b in zip(self.ema.buffers(), self.energy.buffers(), strict=True):
            e.copy_(b)

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
                self._log({"step": self.step, **record.to_log(buffer=len(self.buffer), rollbacks=self.rollbacks)})
            stop = should_stop is not None and self.step < total and should_stop()
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


def _read_stats(**stats: Tensor | None) -> dict[str, float | None]:
    """Scalar tensors as floats, read back in one copy: on a GPU the iteration waits for the device once, not once
    per statistic. ``None`` stays ``None``."""
    names = [k for k, v in stats.items() if v is not None]
    values = torch.stack([stats[k].detach().float().reshape(()) for k in names]).tolist() if names else []
    return {**stats, **dict(zip(names, values, strict=True))}


def _param_grad_norm(loss: Tensor, params: list[Tensor]) -> float:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    norms = [g.norm() for g in grads if g is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


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
