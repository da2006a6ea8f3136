"""The trainer: Algorithm 1 of Du et al. 2021 ("EBM training algorithm").

Per iteration: positives from the data; chain starts from the replay buffer (fresh uniform
noise with probability ``reinit_prob``), augmented; ``K - 1`` Langevin steps without
parameter gradients; the last step inside `ImprovedCDObjective`, which builds the
graph the KL loss needs (so the last step is computed once); ``L_CD + L_KL``; Adam; EMA;
the new negatives go into the buffer.

Health: every iteration checks the loss and the energy difference; a non-finite value or an
exploding difference is reported with its step and, by default, training rolls back to the
last good checkpoint with a new seed. NaNs are never replaced.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn

from composable_ebm.atomic import remove_stale_temporaries
from composable_ebm.configs import MAX_BUFFER_ELEMENTS, JSONConfig, check_range, check_size
from composable_ebm.energy import NULL, Energy, Labels
from composable_ebm.errors import InvalidInputError, ModelFileError
from composable_ebm.images import as_float_images
from composable_ebm.sampling import (
    AugmentConfig,
    SamplerConfig,
    augment,
    chain_grad_norm,
    differentiable_last_step,
    initial_noise,
    run_chain,
)
from composable_ebm.training.buffer import ReplayBuffer
from composable_ebm.training.checkpoint import (
    CORRUPT_FILE_ERRORS,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_atomic,
)
from composable_ebm.training.faults import Fault, TrainingDiverged, fault_reason, raise_if_any_rank_faulted
from composable_ebm.training.lock import RunLock
from composable_ebm.training.log import LOG_NAME, RunLog
from composable_ebm.training.losses import cd_loss, entropy_loss, label_loss, opt_loss, other_values

# settings a resume may change without being asked: how long to train and how often to log or save
RESUMABLE_CHANGES = frozenset({"steps", "log_every", "checkpoint_every"})


@dataclass(frozen=True)
class TrainerConfig(JSONConfig):
    """Settings of Algorithm 1. Defaults follow the paper (32x32), or the authors' code where the paper is silent."""

    steps: int = 10000
    """training iterations"""
    batch_size: int = 16
    """Positives (and chains) per iteration and rank."""
    lr: float = 2e-4
    """Adam (authors' code)"""
    betas: tuple[float, float] = (0.0, 0.9)
    """Adam betas (authors' code)"""
    grad_clip: float | None = 0.5
    """max global gradient norm (authors' code); None: no clipping"""
    ema_decay: float = 0.9999
    """paper; the authors' code uses 0.99"""
    ema_warmup: bool = True
    """decay min(ema_decay, (1 + t) / (10 + t)) at step t, so the EMA is useful early"""
    sampler: SamplerConfig = field(default_factory=lambda: SamplerConfig(step_size=500.0, noise=0.001, steps=40))
    """The training chains: `steps` K (Langevin steps per iteration), step size and noise; Langevin only."""
    chain_augment: AugmentConfig | None = field(default_factory=lambda: AugmentConfig(crop_scale=(0.02, 1.0)))
    """Augmentation of chain starts drawn from the buffer; `false` in a recipe turns it off."""
    data_augment: AugmentConfig | None = None
    """augmentation of the positives (changes only what the model ignores)"""
    negative_labels: Literal["positives", "buffer"] = "positives"
    """the condition each chain runs under"""
    label_weight: float = 0.0
    """L_label: positives under another value as negatives (not in the paper; 0: off)"""
    label_dropout: float = 0.0
    """Probability that a positive (and the chain paired with it) runs under the null condition, every
    attribute unbound: trains the model's unconditional energy, which guided composition needs
    (Composable Diffusion, Liu et al. 2022, and Du et al. 2023 use 5-10%). 0: off."""
    buffer_size: int = 10000
    """Replay buffer capacity (samples)."""
    buffer_policy: Literal["reservoir", "fifo"] = "reservoir"
    """Which samples the full buffer keeps: a uniform `reservoir` sample of all, or the newest (`fifo`)."""
    reinit_prob: float = 0.001
    """chain starts from fresh noise (experiments: 0.1%; Algorithm 1: 1%)"""
    data_start_prob: float = 0.0
    """Probability that a chain starts from a training image drawn independently of its positive (so
    usually of other attribute values) and runs under the positive's condition: the model learns to
    edit its attribute into an image whose other attributes it keeps. Not in the paper; 0: off."""
    cd_l2: float = 1.0
    """alpha of the L2 energy regulariser (authors' code)"""
    kl_opt: bool = True
    """L_opt: energy of samples through the last Langevin step"""
    opt_weight: float = 1.0
    """Weight of L_opt."""
    kl_ent: bool = True
    """L_ent: nearest-neighbour entropy against past samples"""
    ent_weight: float = 0.3
    """authors' code"""
    ent_bank: int = 100
    """|X|, past samples for the nearest-neighbour distance (paper: 100)"""
    ent_min_buffer: int = 100
    """L_ent starts once the buffer holds this many samples"""
    dequantize: bool = True
    """x * 255/256 + U(0, 1/256) for data in [0, 1] (authors' code)"""
    on_fault: Literal["rollback", "stop"] = "rollback"
    """On a non-finite or exploding step: `rollback` to the last checkpoint with a new seed, or `stop`."""
    max_energy_diff: float = 1e4
    """|mean E(x+) - mean E(x-)| above this is a fault"""
    max_rollbacks: int = 5
    """Rollbacks allowed before the run stops."""
    log_every: int = 10
    """JSONL (and TensorBoard) record every this many steps, with gradient norms"""
    checkpoint_every: int = 100
    """Write the full training state every this many steps."""
    seed: int = 0
    """Seeds the network's initialisation, the data order, chains and augmentations."""

    def __post_init__(self) -> None:
        if self.sampler.total_steps < 1:
            raise ValueError("training needs at least one Langevin step per iteration (sampler.steps >= 1)")
        if self.sampler.method != "langevin":
            raise ValueError(
                f"training chains use method 'langevin' (the KL loss differentiates through a Langevin step),"
                f" got {self.sampler.method!r}; MALA is for sampling"
            )
        if self.sampler.augment is not None:
            raise InvalidInputError(
                "TrainerConfig.sampler.augment is set, but a training chain takes one augmentation: chain_augment,"
                " of its start ([trainer.chain_augment] in a recipe); move the setting there"
                " ([sampling.augment] is the sampling chains')")
        if self.negative_labels not in ("positives", "buffer"):
            raise ValueError(f"unknown negative_labels {self.negative_labels!r}; valid choices: ['buffer', 'positives']")
        if self.label_weight < 0:
            raise ValueError(f"label_weight must be >= 0, got {self.label_weight}")
        owner = "TrainerConfig"
        check_range(owner, "ema_decay", self.ema_decay, 0.0, 1.0, high_open=True)
        check_range(owner, "reinit_prob", self.reinit_prob, 0.0, 1.0)
        check_range(owner, "data_start_prob", self.data_start_prob, 0.0, 1.0)
        check_size(owner, "seed", self.seed, low=0, high=2**62)  # rollbacks and ranks add offsets to it
        check_range(owner, "label_dropout", self.label_dropout, 0.0, 1.0, high_open=True)
        check_range(owner, "lr", self.lr, 0.0, low_open=True)
        for i, beta in enumerate(self.betas):
            check_range(owner, f"betas[{i}]", beta, 0.0, 1.0, high_open=True)
        if self.grad_clip is not None:
            check_range(owner, "grad_clip", self.grad_clip, 0.0, low_open=True)
        for name in ("cd_l2", "opt_weight", "ent_weight", "label_weight"):
            check_range(owner, name, getattr(self, name), 0.0)
        check_range(owner, "max_energy_diff", self.max_energy_diff, 0.0, low_open=True)
        check_size(owner, "batch_size", self.batch_size, high=1 << 20)
        check_size(owner, "buffer_size", self.buffer_size, low=0, high=1 << 24)
        check_size(owner, "ent_bank", self.ent_bank, high=1 << 20)
        check_size(owner, "ent_min_buffer", self.ent_min_buffer, low=0, high=1 << 24)
        check_size(owner, "max_rollbacks", self.max_rollbacks, low=0, high=1000)
        check_size(owner, "steps", self.steps, low=0, high=1 << 40)
        check_size(owner, "log_every", self.log_every, high=1 << 40)
        check_size(owner, "checkpoint_every", self.checkpoint_every, high=1 << 40)
        if self.on_fault not in ("rollback", "stop"):
            raise ValueError(f"unknown on_fault {self.on_fault!r}; valid choices: ['rollback', 'stop']")
        if self.batch_size < 1 or self.steps < 0 or self.log_every < 1 or self.checkpoint_every < 1:
            raise ValueError("batch_size, log_every and checkpoint_every must be >= 1 and steps >= 0")


class TrainingData(Protocol):
    """In-memory training data: ``images`` ``(N, *input_shape)`` (float in the value range, or
    uint8 scaled by 1/255) and ``labels``: attribute -> value indices ``(N,)``."""

    images: Tensor
    labels: Mapping[str, Tensor]


@dataclass
class ObjectiveOutput:
    """The loss terms and statistics of one iteration; the same fields whichever terms are on."""

    cd: Tensor  # L_CD with its L2 regulariser
    opt: Tensor | None  # weighted L_opt, None when kl_opt is off
    ent: Tensor | None  # weighted L_ent, None when off or before the buffer holds ent_min_buffer samples
    label: Tensor | None  # weighted L_label, None when label_weight is 0 or no other labels are given
    e_pos: Tensor  # mean energy of the positives (detached)
    e_neg: Tensor  # mean energy of the negatives (detached)
    langevin_grad_norm: Tensor  # mean |dE/dx| at the last step's start (detached)
    x_neg: Tensor  # the negatives, detached (for the buffer)

    @property
    def kl(self) -> Tensor | None:
        """``L_KL = L_opt + L_ent`` over the terms that are on, ``None`` if none is."""
        terms = [t for t in (self.opt, self.ent) if t is not None]
        return sum(terms[1:], terms[0]) if terms else None

    @property
    def loss(self) -> Tensor:
        terms = [t for t in (self.kl, self.label) if t is not None]
        return sum(terms, self.cd)


class ImprovedCDObjective(nn.Module):
    """Every path from the parameters to the loss, in one forward (so DDP sees one forward per step).

    Runs the last Langevin step (differentiable in the parameters when a KL term is on), then
    returns an `ObjectiveOutput` with the loss terms and the statistics of the step.
    """

    def __init__(self, energy: Energy, config: TrainerConfig) -> None:
        super().__init__()
        self.energy = energy
        self.config = config

    def forward(
        self,
        x_pos: Tensor,
        pos_labels: Labels | None,
        x_prev: Tensor,
        neg_labels: Labels | None,
        generator: torch.Generator,
        bank: Tensor | None,
        other_labels: Labels | None = None,
    ) -> ObjectiveOutput:
        """The losses of one iteration (one forward, so DDP sees every parameter-gradient path)."""
        cfg, s = self.config, self.config.sampler
        use_ent = cfg.kl_ent and bank is not None
        differentiable = cfg.kl_opt or use_ent
        use_label = cfg.label_weight > 0 and bool(other_labels)
        # the chain's last Langevin step, differentiable in the parameters through dE/dx when a KL term is on
        x_hat, prev = differentiable_last_step(self.energy, x_prev, s, generator, neg_labels, create_graph=differentiable)
        x_neg = x_hat.detach()
        e_pos = self.energy(x_pos, pos_labels)
        e_neg = self.energy(x_neg, neg_labels)
        return ObjectiveOutput(
            cd=cd_loss(e_pos, e_neg, cfg.cd_l2),
            opt=cfg.opt_weight * opt_loss(self.energy, x_hat, neg_labels) if cfg.kl_opt else None,
            ent=cfg.ent_weight * entropy_loss(x_hat, bank) if use_ent else None,
            label=cfg.label_weight * label_loss(self.energy, x_pos, e_pos, pos_labels, other_labels, cfg.cd_l2)
            if use_label else None,
            e_pos=e_pos.detach().mean(),
            e_neg=e_neg.detach().mean(),
            langevin_grad_norm=chain_grad_norm(prev.grad.detach()),
            x_neg=x_neg,
        )


@dataclass
class TrainingSummary:
    steps: int
    rollbacks: int
    faults: list[dict[str, Any]]
    seconds_per_step: float


class Trainer:
    """Algorithm 1 for any `Energy` (conditional or not) on in-memory data.

    Args:
        energy: the model to train (moved to ``device``).
        data: a `TrainingData` (images and labels) or a plain tensor of images.
        config: training settings.
        out_dir: where ``checkpoint.pt``, ``log.jsonl`` (and TensorBoard files) go; ``None``:
            keep the rollback checkpoint in memory and write nothing.
        device: training device (default: the model's).
    """

    CHECKPOINT = "checkpoint.pt"
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
        self.energy = energy.to(self.device)
        self.images, self.labels = self._check_data(energy, data)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.objective: nn.Module = ImprovedCDObjective(self.energy, config)
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
            config.buffer_size, energy.input_shape, sorted(energy.attributes), self.device, config.buffer_policy
        )
        self.step = 0
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
        return images.to(self.device), labels

    @property
    def checkpoint_path(self) -> Path | None:
        return self.out_dir / self.CHECKPOINT if self.out_dir is not None else None

    # ------------------------------------------------------------ one iteration
    def _draw_images(self, n: int) -> tuple[Tensor, Tensor]:
        """``n`` training images drawn uniformly with replacement (float), and their indices."""
        idx = torch.randint(self.images.shape[0], (n,), generator=self.generator, device=self.device)
        return as_float_images(self.images[idx]), idx

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

        Starts are buffer samples, or fresh uniform noise with probability ``reinit_prob``.
        By default every chain runs under the labels of the positive it is paired with (the
        authors' Algorithm 1), so the label mix of the negatives is the data's and a sample
        made under one label is often restarted under another. ``negative_labels="buffer"``
        keeps the label a buffer sample was made under instead; that mix drifts like a
        Polya urn and is there for experiments only.
        """
        noise = initial_noise(self.energy, n, self.generator, self.device, self.config.sampler.init_scale)
        if len(self.buffer) == 0:
            return self._from_data(noise), dict(pos_labels)
        old, old_labels = self.buffer.sample(n, self.generator)
        fresh = torch.rand(n, generator=self.generator, device=self.device) < self.config.reinit_prob
        shape = (-1,) + (1,) * (noise.ndim - 1)
        x = self._from_data(torch.where(fresh.view(shape), noise, old))
        if self.config.negative_labels == "positives":
            return x, dict(pos_labels)
        return x, {a: torch.where(fresh, pos_labels[a], old_labels[a]) for a in pos_labels}

    def _from_data(self, x: Tensor) -> Tensor:
        """Replace each start by an independently drawn training image with probability ``data_start_prob``."""
        p = self.config.data_start_prob
        if p == 0:
            return x
        images, _ = self._draw_images(x.shape[0])
        use = torch.rand(x.shape[0], generator=self.generator, device=self.device) < p
        return torch.where(use.view((-1,) + (1,) * (x.ndim - 1)), images.to(x.dtype), x)

    def train_step(self) -> dict[str, float]:
        """One iteration of Algorithm 1; returns its statistics (raises on a fault)."""
        cfg, s = self.config, self.config.sampler
        t0 = time.perf_counter()
        model = self.energy
        x_pos, pos_labels = self._positives(cfg.batch_size)
        x, neg_labels = self._chain_starts(cfg.batch_size, pos_labels)
        if cfg.chain_augment is not None:
            x = augment(x, cfg.chain_augment, self.generator)
        labels = neg_labels or None
        # every step but the last through the sampler's chain code; the last runs in the objective, once
        x = run_chain(model, x, s, self.generator, labels, num_steps=s.total_steps - 1).x
        bank = None
        if cfg.kl_ent and len(self.buffer) >= max(cfg.ent_min_buffer, 1):
            bank, _ = self.buffer.sample(cfg.ent_bank, self.generator)
        others = other_values(pos_labels, model.attributes, self.generator) if cfg.label_weight and pos_labels else None
        out: ObjectiveOutput = self.objective(x_pos, pos_labels or None, x, labels, self.generator, bank, others)
        loss = out.loss
        stats = {
            "loss": float(loss.detach()),
            "loss_cd": float(out.cd.detach()),
            "loss_opt": float(out.opt.detach()) if out.opt is not None else 0.0,
            "loss_ent": float(out.ent.detach()) if out.ent is not None else 0.0,
            "loss_label": float(out.label.detach()) if out.label is not None else 0.0,
            "e_pos": float(out.e_pos),
            "e_neg": float(out.e_neg),
            "e_diff": float(out.e_pos - out.e_neg),
            "langevin_grad_norm": float(out.langevin_grad_norm),
        }
        raise_if_any_rank_faulted(fault_reason(stats, cfg.max_energy_diff), self.device)
        logging = (self.step + 1) % cfg.log_every == 0 or self.step + 1 == self._fit_total  # a run logs its last step
        params = [p for p in model.parameters() if p.requires_grad]
        if logging:  # gradient norms of L_CD and L_KL separately (the paper's figure of their magnitudes)
            stats["grad_norm_cd"] = _param_grad_norm(out.cd, params)
            stats["grad_norm_kl"] = _param_grad_norm(out.kl, params) if out.kl is not None else 0.0
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip is not None:
            total = nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        else:
            total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        stats["grad_norm"] = float(total)
        if not math.isfinite(stats["grad_norm"]):
            raise Fault(f"non-finite gradient norm {stats['grad_norm']}")
        self.optimizer.step()
        self._update_ema()
        self.buffer.add(out.x_neg, neg_labels, self.generator)
        self.step += 1
        stats["seconds"] = time.perf_counter() - t0
        stats["images_per_second"] = cfg.batch_size * self.world_size / stats["seconds"]
        return stats

    @torch.no_grad()
    def _update_ema(self) -> None:
        decay = self.config.ema_decay
        if self.config.ema_warmup:  # bias-free early average (as TensorFlow's ExponentialMovingAverage)
            decay = min(decay, (1.0 + self.step) / (10.0 + self.step))
        for e, p in zip(self.ema.parameters(), self.energy.parameters()):
            e.lerp_(p.detach(), 1.0 - decay)
        for e, b in zip(self.ema.buffers(), self.energy.buffers()):
            e.copy_(b)

    # ----------------------------------------------------------------- the loop
    def fit(
        self, steps: int | None = None, callback: Callable[[int, dict[str, float]], None] | None = None
    ) -> TrainingSummary:
        """Train until ``steps`` iterations in total (default: ``config.steps``), resuming counts.

        ``callback(step, stats)`` runs after every successful iteration (e.g. a progress bar).
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
                stats = self.train_step()
            except Fault as fault:
                self._handle_fault(self.step + 1, fault.reason)
                continue
            if callback is not None:
                callback(self.step, stats)
            if self.step % self.config.log_every == 0 or self.step == total:  # the last step too, so a short run can be plotted
                self._log({"step": self.step, **stats, "buffer": len(self.buffer), "rollbacks": self.rollbacks})
            if self.step % self.config.checkpoint_every == 0 or self.step == total:
                self.save_checkpoint()
        done = self.step - start_step
        return TrainingSummary(self.step, self.rollbacks, self.faults, (time.perf_counter() - t_start) / max(done, 1))

    def _handle_fault(self, step: int, reason: str) -> None:
        event = {"event": "fault", "step": step, "reason": reason}
        stop = self.config.on_fault == "stop" or self.rollbacks >= self.config.max_rollbacks
        event["action"] = "stop" if stop else "rollback"
        self.faults.append(event)
        self._log(event)
        if stop:
            raise TrainingDiverged(step, reason)
        self.rollbacks += 1
        rollbacks = self.rollbacks
        self._restore(self._latest_checkpoint())
        self.rollbacks = rollbacks
        self.generator.manual_seed(self._seed(rollbacks))  # a new seed, so the same fault is not replayed
        if self.log is not None:  # the steps after the checkpoint will be redone: drop their records
            self.log.truncate(self.step)
            self.log.append(event)
        self._log({"event": "rolled_back", "to_step": self.step, "rollbacks": rollbacks})

    # ------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """The full training state: model, EMA, optimiser, buffer, RNG states, step and settings."""
        return {
            "format": 1,
            "step": self.step,
            "rollbacks": self.rollbacks,
            "model": self.energy.state_dict(),  # DDP wraps the objective, never the energy itself
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "rng": capture_rng_state(self.generator),
            "trainer_config": json.dumps(self.config.to_dict()),
        }

    def save_checkpoint(self) -> None:
        """Write the full training state atomically (rank 0); keep it in memory without ``out_dir``."""
        if self.checkpoint_path is None:
            self._memory_checkpoint = copy.deepcopy(self.state_dict())
        elif self.rank == 0:
            save_atomic(self.state_dict(), self.checkpoint_path)
        self._has_own_checkpoint = True
        if self.distributed:
            dist.barrier()

    def _latest_checkpoint(self) -> dict[str, Any] | None:
        if self.checkpoint_path is None:
            return self._memory_checkpoint
        return load_checkpoint(self.checkpoint_path, self.device) if self.checkpoint_path.is_file() else None

    def resume(self, path: str | Path | None = None, allow_config_change: bool = False) -> bool:
        """Load ``path`` (default ``out_dir/checkpoint.pt``) if it exists; returns whether it did.

        The checkpoint's training settings must equal this trainer's, except those in
        `RESUMABLE_CHANGES`; otherwise a ``ValueError`` names the keys that differ.
        ``allow_config_change=True`` resumes anyway and records the change in the log.
        """
        path = Path(path) if path is not None else self.checkpoint_path
        if path is None or not path.is_file():
            return False
        state = load_checkpoint(path, self.device)
        try:
            saved = json.loads(state["trainer_config"])
            if not isinstance(saved, dict):
                raise TypeError(f"trainer_config holds a {type(saved).__name__}")
        except (KeyError, TypeError, ValueError) as err:
            raise ModelFileError(f"{path}: unreadable training settings; start fresh with --no-resume --overwrite (the old files are kept aside) or another --out") from err
        # a setting added to TrainerConfig after the checkpoint was written had its default then
        changed = config_differences(_with_defaults(saved, TrainerConfig().to_dict()), self.config.to_dict())
        changed = {k: v for k, v in changed.items() if k not in RESUMABLE_CHANGES}
        if changed and not allow_config_change:
            keys = ", ".join(f"{k} ({old!r} -> {new!r})" for k, (old, new) in sorted(changed.items()))
            raise InvalidInputError(
                f"{path} was trained with other settings: {keys}; resume with the same recipe, start fresh"
                " (--no-resume --overwrite keeps the old files aside), or allow the change explicitly (--allow-config-change)"
            )
        try:
            self._restore(state)
        except CORRUPT_FILE_ERRORS as err:  # another model's or a damaged checkpoint
            reason = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
            raise ModelFileError(f"{path} does not fit this model or is damaged ({reason}); start fresh with"
                                 " --no-resume") from err
        self._has_own_checkpoint = True
        if self.log is not None:
            self.log.truncate(self.step)
            if changed:
                self.log.append({"event": "config_changed", "step": self.step,
                                 "changes": {k: {"old": o, "new": n} for k, (o, n) in changed.items()}})
        return True

    def _restore(self, state: dict[str, Any] | None) -> None:
        if state is None:
            raise RuntimeError("no checkpoint to restore")
        self.energy.load_state_dict(state["model"], strict=True)
        self.ema.load_state_dict(state["ema"], strict=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        restore_rng_state(state["rng"], self.generator)
        self.step = int(state["step"])
        self.rollbacks = int(state["rollbacks"])
        if self.rank != 0:
            # the checkpoint holds rank 0's generator and buffer; other ranks must not replay rank 0's draws
            self.generator.manual_seed(self._seed(self.rollbacks) + 104_729 * self.step)

    # ----------------------------------------------------------------- logging
    def _log(self, record: dict[str, Any]) -> None:
        if self.log is not None:
            self.log.append(record)


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ between two nested settings dicts: ``key -> (old, new)``."""
    out: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.update(config_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = (a, b)
    return out


def _with_defaults(saved: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``saved`` with every key it lacks taken from ``defaults`` (recursively into nested settings)."""
    out = dict(saved)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(out[key], Mapping) and isinstance(value, Mapping):
            out[key] = _with_defaults(out[key], value)
    return out


def _param_grad_norm(loss: Tensor, params: list[Tensor]) -> float:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    norms = [g.norm() for g in grads if g is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def init_distributed() -> bool:
    """Initialise torch.distributed from torchrun's environment variables; returns whether it did."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.is_initialized()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, init_method="env://")
    return True
