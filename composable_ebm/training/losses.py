"""Losses of improved contrastive divergence (Du et al. 2021, Section 3), as plain functions.

``L_full = L_CD + L_KL`` with ``L_KL = L_opt + L_ent``:

- ``L_CD = mean E(x+) - mean E(stop_grad(x-))`` (Eq. 4), plus the authors' optional L2
  regulariser ``alpha * mean(E(x+)^2 + E(x-)^2)``;
- ``L_opt = mean E_{stop_grad(theta)}(x^)`` where ``x^`` is the sample after the last Langevin
  step, kept differentiable in ``theta`` through that step's ``dE/dx`` (Eq. 6);
- ``L_ent = mean -log NN(x^, X)``, the nearest-neighbour entropy estimate against past
  samples ``X`` (Eq. 7).

Optionally, for conditional energies, ``L_label``: a second contrastive term whose negatives are
the positives themselves under another value of one conditioned attribute,
``mean E(x+ | y) - mean E(x+ | y') + alpha * mean(E(x+ | y)^2 + E(x+ | y')^2)`` (not in the
paper). Contrastive divergence learns a value's energy only from chains run under that value;
while the sampler cannot draw the detail that separates two values, nothing tells their energies
apart. The L2 term bounds both energies near ``-/+ 1 / (2 alpha)`` whatever the weight, keeping
the energy on the scale of models trained without it, which matters when energies are added.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor
from torch.func import functional_call

from composable_ebm.energy import Energy, Labels


def cd_loss(e_pos: Tensor, e_neg: Tensor, l2_weight: float = 1.0) -> Tensor:
    """``mean E(x+) - mean E(x-)`` plus ``l2_weight * mean(E(x+)^2 + E(x-)^2)``; pass ``e_neg`` of detached samples."""
    loss = e_pos.mean() - e_neg.mean()
    if l2_weight:
        loss = loss + l2_weight * (e_pos.pow(2).mean() + e_neg.pow(2).mean())
    return loss


def frozen_energy(energy: Energy, x: Tensor, labels: Labels | None = None) -> Tensor:
    """``E_{stop_grad(theta)}(x)``: the energy with detached parameters, still differentiable in ``x``.

    Uses ``torch.func.functional_call`` rather than toggling ``requires_grad``, so the module's
    flags are never changed (safe under DDP and for concurrent users of the model).
    """
    detached: Mapping[str, Tensor] = {name: p.detach() for name, p in energy.named_parameters()}
    return functional_call(energy, detached, (x,), {"labels": labels})


def opt_loss(energy: Energy, x_hat: Tensor, labels: Labels | None = None) -> Tensor:
    """``L_opt``: mean frozen-parameter energy of the differentiable last-step sample ``x_hat``."""
    return frozen_energy(energy, x_hat, labels).mean()


def nearest_neighbour_distance(x: Tensor, bank: Tensor) -> Tensor:
    """L2 distance from each row of ``x`` ``(B, ...)`` to its nearest row of ``bank`` ``(M, ...)``: ``(B,)``.

    Squared distances come from ``|x|^2 + |b|^2 - 2 x.b`` (a ``(B, M)`` matrix), never a
    ``(B, M, D)`` tensor of differences.
    """
    xf, bf = x.flatten(1), bank.flatten(1).to(x.dtype)
    sq = xf.pow(2).sum(1, keepdim=True) + bf.pow(2).sum(1).unsqueeze(0) - 2.0 * xf @ bf.T  # (B, M)
    # clamp: rounding can make a tiny squared distance negative; the floor also keeps sqrt's gradient finite
    return sq.min(dim=1).values.clamp_min(1e-12).sqrt()


def entropy_loss(x_hat: Tensor, bank: Tensor, eps: float = 1e-8) -> Tensor:
    """``L_ent = mean -log NN(x_hat, bank)``; ``eps`` keeps ``log`` finite for an exact duplicate."""
    return -torch.log(nearest_neighbour_distance(x_hat, bank) + eps).mean()


def other_values(labels: Labels, attributes: Mapping[str, tuple[str, ...]], generator: torch.Generator) -> dict[str, Tensor]:
    """For each attribute, a uniformly drawn value different from each label ``(N,)`` (an unbound
    label, ``NULL``, stays unbound)."""
    out = {}
    for attr, y in labels.items():
        k = len(attributes[attr])
        shift = torch.randint(1, k, y.shape, generator=generator, device=y.device) if k > 1 else torch.zeros_like(y)
        out[attr] = torch.where(y < 0, y, (y + shift) % k)
    return out


def label_loss(
    energy: Energy, x_pos: Tensor, e_pos: Tensor, labels: Labels, others: Labels, l2_weight: float = 1.0
) -> Tensor:
    """``L_label``: mean over conditioned attributes ``a`` of ``cd_loss(E(x+ | y), E(x+ | y'), l2_weight)``
    where ``y'`` is ``y`` with ``a := others[a]``.

    ``e_pos`` is ``E(x+ | y)`` (already computed for ``L_CD``); one forward per attribute.
    """
    terms = [cd_loss(e_pos, energy(x_pos, {**labels, attr: others[attr]}), l2_weight) for attr in labels]
    return torch.stack(terms).mean()
