"""`StepRecord`: what one training iteration measured, typed. The log, fault checks, plots and the CLI read its fields."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class StepRecord:
    """The statistics of one training iteration (Algorithm 1, or a denoising step of a noise-conditioned model).

    A loss term that is off (or not yet on, as ``L_ent`` before the buffer fills) is ``None``, never a
    stand-in 0; so are the per-term gradient norms outside logged steps. `to_log` writes the fields
    that are set, in this order, as one ``log.jsonl`` record.
    """

    loss: float  # the total: L_CD + L_KL (+ L_label), or the denoising loss
    loss_cd: float | None = None  # L_CD with its L2 regulariser (contrastive divergence)
    loss_opt: float | None = None  # weighted L_opt
    loss_ent: float | None = None  # weighted L_ent
    loss_label: float | None = None  # weighted L_label
    e_pos: float | None = None  # mean energy of the positives
    e_neg: float | None = None  # mean energy of the negatives
    e_diff: float | None = None  # e_pos - e_neg (of the unrounded means)
    langevin_grad_norm: float | None = None  # mean |dE/dx| at the last Langevin step's start
    loss_dsm: float | None = None  # denoising score matching: mean squared error of the predicted noise
    loss_classifier: float | None = None  # denoising: the implicit classifier's cross-entropy, unweighted
    e_noised: float | None = None  # denoising: mean energy of the noised points
    grad_norm_cd: float | None = None  # |d L_CD / d params|, on logged steps
    grad_norm_kl: float | None = None  # |d L_KL / d params|, on logged steps with a KL term
    grad_norm: float | None = None  # |d loss / d params| before clipping, once the backward pass ran
    lr: float | None = None  # the learning rate of this iteration's Adam step (`TrainerConfig.lr_schedule`)
    seconds: float | None = None  # wall time of the iteration
    images_per_second: float | None = None  # positives per second over every rank

    def to_log(self, **extra: Any) -> dict[str, Any]:
        """The record for ``log.jsonl``: the set fields (``None`` ones left out), then ``extra``."""
        return {**{f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}, **extra}
