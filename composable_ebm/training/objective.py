"""Algorithm 1's loss: every path from the parameters to ``L_CD + L_KL`` (+ the optional label term) in one forward."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from composable_ebm.energy import Energy, Labels
from composable_ebm.sampling import chain_grad_norm, differentiable_last_step
from composable_ebm.training.config import TrainerConfig
from composable_ebm.training.losses import cd_loss, entropy_loss, label_loss, opt_loss


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
