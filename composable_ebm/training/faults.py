"""Training faults: what counts as one, and the error raised when training gives up.

A fault is a non-finite loss, energy or gradient norm, or an energy difference beyond
``max_energy_diff``. It is detected before the optimiser moves; the trainer then rolls back to
its last good checkpoint with a new seed, or stops. NaNs are never replaced. Under DDP every
rank learns whether any rank faulted, so all take the same branch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from composable_ebm.errors import RunFailure

if TYPE_CHECKING:  # pragma: no cover
    from composable_ebm.training.record import StepRecord


class TrainingDiverged(RunFailure):
    """Raised when training faults and ``on_fault="stop"`` (or the rollback budget is spent)."""

    def __init__(self, step: int, reason: str) -> None:
        super().__init__(f"training diverged at step {step}: {reason}")
        self.step = step
        self.reason = reason


class Fault(Exception):
    """A fault in the current iteration (the trainer catches it and rolls back or stops)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def fault_reason(record: StepRecord, max_energy_diff: float | None) -> str | None:
    """Why an iteration's statistics are a fault, or ``None``: a non-finite statistic, or (``max_energy_diff`` given)
    a difference of the positives' and negatives' energies past it."""
    for key in ("loss", "e_pos", "e_neg", "e_noised"):
        value = getattr(record, key)
        if value is not None and not math.isfinite(value):
            return f"non-finite {key} ({value})"
    if max_energy_diff is not None and record.e_diff is not None and abs(record.e_diff) > max_energy_diff:
        return f"energy difference {record.e_diff:.4g} exceeds max_energy_diff {max_energy_diff:g}"
    return None


def raise_if_any_rank_faulted(reason: str | None, device: torch.device) -> None:
    """Raise `Fault` if this rank (or, under DDP, any rank) found one."""
    if dist.is_available() and dist.is_initialized():  # every rank must take the same branch
        flag = torch.tensor([float(reason is not None)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and reason is None:
            reason = "a fault on another rank"
    if reason is not None:
        raise Fault(reason)
