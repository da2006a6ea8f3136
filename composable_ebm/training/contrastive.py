"""Contrastive divergence, Algorithm 1 of Du et al. 2021 ("EBM training algorithm"): the objective of a model of
clean data.

Per iteration: positives from the data; chain starts from the replay buffer (fresh uniform noise with probability
``reinit_prob``), augmented; ``K - 1`` Langevin steps without parameter gradients; the last step inside
`ImprovedCDObjective`, which builds the graph the KL loss needs (so the last step is computed once); ``L_CD + L_KL``
(+ the optional label term); then the loop's Adam and EMA; the new negatives go into the buffer.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from composable_ebm.configs import MAX_BUFFER_ELEMENTS
from composable_ebm.energy import Energy, Labels
from composable_ebm.errors import InvalidInputError
from composable_ebm.sampling import algorithm2, augment, chain_grad_norm, differentiable_last_step, initial_noise
from composable_ebm.training.buffer import ReplayBuffer
from composable_ebm.training.config import ContrastiveConfig
from composable_ebm.training.faults import fault_reason
from composable_ebm.training.losses import cd_loss, entropy_loss, label_loss, opt_loss, other_values
from composable_ebm.training.record import StepRecord

if TYPE_CHECKING:  # pragma: no cover; the loop hands itself to its objective
    from composable_ebm.training.loop import Loop


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

    def __init__(self, energy: Energy, config: ContrastiveConfig) -> None:
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


class ContrastiveDivergence:
    """One iteration of Algorithm 1 for the training loop (`composable_ebm.training.Trainer`), with the replay buffer
    its chains start from; the loop supplies the positives, the backward pass, Adam and the EMA."""

    def __init__(self, trainer: Loop, config: ContrastiveConfig) -> None:
        self.trainer, self.config = trainer, config
        energy = trainer.energy
        elements = config.buffer_size * math.prod(energy.input_shape)
        if elements > MAX_BUFFER_ELEMENTS:
            raise InvalidInputError(
                f"ContrastiveConfig.buffer_size {config.buffer_size:,} of inputs {tuple(energy.input_shape)} is {elements:,} elements"
                f" ({4 * elements / 2**30:,.1f} GiB in float32); at most {MAX_BUFFER_ELEMENTS:,} (8 GiB)")
        self.buffer = ReplayBuffer(config.buffer_size, energy.input_shape, sorted(energy.attributes), trainer.device,
                                   config.buffer_policy)
        self.loss = trainer.parallel(ImprovedCDObjective(energy, config))
        self._pending: tuple[Tensor, dict[str, Tensor]] | None = None  # the last iteration's negatives, until applied

    def step(self) -> StepRecord:
        """One iteration up to the update: chains, losses and their backward pass; the loop applies it."""
        loop, cfg, s = self.trainer, self.config, self.config.sampler
        model, generator = loop.energy, loop.generator
        x_pos, pos_labels = loop.positives(loop.config.batch_size)
        x, neg_labels = self._chain_starts(loop.config.batch_size, pos_labels)
        labels = neg_labels or None
        if cfg.chain_steps_max is not None:  # this iteration's chain length, from the run's generator (resumable)
            k = int(torch.randint(s.steps, cfg.chain_steps_max + 1, (1,), generator=generator, device=loop.device))
            s = dataclasses.replace(s, steps=k)
        # every step but the last through the sampler's chain code; the last runs in the objective, once
        x = algorithm2(model, x, s, generator, labels, num_steps=s.total_steps - 1,
                       cuda_graphs=loop.speed.cuda_graphs).x
        bank = None
        if cfg.kl_ent and len(self.buffer) >= max(cfg.ent_min_buffer, 1):
            bank, _ = self.buffer.sample(cfg.ent_bank, generator)
        others = other_values(pos_labels, model.attributes, generator) if cfg.label_weight and pos_labels else None
        out: ObjectiveOutput = self.loss(x_pos, pos_labels or None, x, labels, generator, bank, others)
        params = [p for p in model.parameters() if p.requires_grad]
        per_term = {}
        if loop.logs_this_step():  # gradient norms of L_CD and L_KL separately (the paper's figure of their magnitudes)
            per_term["grad_norm_cd"] = _param_grad_norm(out.cd, params)
            per_term["grad_norm_kl"] = _param_grad_norm(out.kl, params) if out.kl is not None else None
        grad_norm = loop.backward(out.loss)
        record = StepRecord(**_read_stats(
            loss=out.loss, loss_cd=out.cd, loss_opt=out.opt, loss_ent=out.ent, loss_label=out.label, e_pos=out.e_pos,
            e_neg=out.e_neg, e_diff=out.e_pos - out.e_neg, langevin_grad_norm=out.langevin_grad_norm,
            grad_norm=grad_norm), **per_term)
        self._pending = (out.x_neg, neg_labels)
        return record

    def applied(self) -> None:
        """The loop applied the iteration: its negatives go into the buffer."""
        x_neg, labels = self._pending
        self.buffer.add(x_neg, labels, self.trainer.generator)
        self._pending = None

    def fault(self, record: StepRecord) -> str | None:
        """Why ``record`` is a fault: a non-finite statistic, or an energy difference past ``max_energy_diff``."""
        return fault_reason(record, self.config.max_energy_diff)

    def _chain_starts(self, n: int, pos_labels: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """Chain starts and the labels their chains run under.

        Starts are buffer samples, each through one ``chain_augment`` transition, or fresh uniform noise with
        probability ``reinit_prob`` (never augmented: a crop of noise is smoother noise than sampling starts from).
        Every chain runs under the labels of the positive it is paired with (the authors' Algorithm 1), so the
        label mix of the negatives is the data's and a sample made under one label is often restarted under another.
        """
        loop = self.trainer
        noise = initial_noise(loop.energy, n, loop.generator, loop.device, self.config.sampler.init_scale)
        if len(self.buffer) == 0:
            return self._from_data(noise), dict(pos_labels)
        old, _ = self.buffer.sample(n, loop.generator)
        fresh = torch.rand(n, generator=loop.generator, device=loop.device) < self.config.reinit_prob
        if self.config.chain_augment is not None:  # a transition of the chains continued from the buffer only
            old = augment(old, self.config.chain_augment, loop.generator)
        shape = (-1,) + (1,) * (noise.ndim - 1)
        return self._from_data(torch.where(fresh.view(shape), noise, old)), dict(pos_labels)

    def _from_data(self, x: Tensor) -> Tensor:
        """Replace each start by an independently drawn training image with probability ``data_start_prob``."""
        p = self.config.data_start_prob
        if p == 0:
            return x
        loop = self.trainer
        images, _ = loop.draw_images(x.shape[0])
        use = torch.rand(x.shape[0], generator=loop.generator, device=loop.device) < p
        return torch.where(use.view((-1,) + (1,) * (x.ndim - 1)), images.to(x.dtype), x)

    # ------------------------------------------------------------- its state
    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any], resize: bool = False) -> None:
        self.buffer.load_state_dict(state["buffer"], resize=resize)

    def restored(self) -> None:
        """The loop restored a checkpoint; nothing here outlives it but the buffer, which the state holds."""

    def log_fields(self) -> dict[str, Any]:
        return {"buffer": len(self.buffer)}

    # ------------------------------------------------------------- its cost
    def evaluations_per_step(self) -> int:
        """Energy-and-gradient evaluations of one iteration, about: the chain, then the losses' passes."""
        return (self.config.chain_steps_max or self.config.sampler.total_steps) + 4

    def state_bytes(self) -> int:
        """Bytes of the objective's own state in a checkpoint: the replay buffer's samples (float32)."""
        keeps = self.config.reinit_prob < 1
        return self.config.buffer_size * math.prod(self.trainer.energy.input_shape) * 4 if keeps else 0


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
