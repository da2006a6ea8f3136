"""`StepRecord`: what one training iteration measured, typed. The log, fault checks, plots and the CLI read its fields."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class StepRecord:
    """The statistics of one iteration of Algorithm 1.

    A loss term that is off (or not yet on, as ``L_ent`` before the buffer fills) is ``None``, never a
    stand-in 0; so are the per-term gradient norms outside logged steps. `to_log` writes the fields
    that are set, in this order, as one ``log.jsonl`` record.
    """

    loss: float  # the total, L_CD + L_KL (+ L_label)
    loss_cd: float  # L_CD with its L2 regulariser
    loss_opt: float | None  # weighted L_opt
    loss_ent: float | None  # weighted L_ent
    loss_label: float | None  # weighted L_label
    e_pos: float  # mean energy of the positives
    e_neg: float  # mean energy of the negatives
    e_diff: float  # e_pos - e_neg (of the unrounded means)
    langevin_grad_norm: float  # mean |dE/dx| at the last Langevin step's start
    grad_norm_cd: float | None = None  # |d L_CD / d params|, on logged steps
    grad_norm_kl: float | None = None  # |d L_KL / d params|, on logged steps with a KL term
    grad_norm: float | None = None  # |d loss / d params| before clipping, once the backward pass ran
    seconds: float | None = None  # wall time of the iteration
    images_per_second: float | None = None  # positives per second over every rank

    def to_log(self, **extra: Any) -> dict[str, Any]:
        """The record for ``log.jsonl``: the set fields (``None`` ones left out), then ``extra``."""
        return {**{f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}, **extra}
