"""A run's speed settings: what `composable_ebm.accel` may do to make it faster, read when a run starts.

Nothing here is read at import or held process-wide: a sampling call and a trainer each take a `Speed` when they
start (`Speed.from_environment` unless one is given), so a setting changed between two runs applies to the next.

- ``CEBM_CUDA_GRAPHS``: ``1`` (the default) replays a chain's runs of identical transitions, and a denoising
  trainer's iterations, from CUDA graphs on a GPU (`composable_ebm.accel.graphs`); ``0`` runs them eagerly.
- ``CEBM_OWN_DERIVATIVES``: ``cpu`` (the default) has the layers state their own second derivatives on the CPU
  (`composable_ebm.accel.derivatives`), ``1`` on every device, ``0`` nowhere (autograd's formulas).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from composable_ebm.errors import InvalidInputError

OWN_DERIVATIVES = ("0", "1", "cpu")


@dataclass(frozen=True)
class Speed:
    """What a run may do to go faster; the results are the same either way (to the rounding of other kernels)."""

    cuda_graphs: bool = True
    """replay runs of identical transitions (and a denoising trainer's iterations) from CUDA graphs on a GPU"""
    own_derivatives: Literal["0", "1", "cpu"] = "cpu"
    """where the layers state their own second derivatives: ``cpu``, ``1`` (every device) or ``0`` (nowhere)"""

    def __post_init__(self) -> None:
        if not isinstance(self.cuda_graphs, bool):
            raise InvalidInputError(f"Speed.cuda_graphs must be true or false, got {self.cuda_graphs!r}")
        if self.own_derivatives not in OWN_DERIVATIVES:
            raise InvalidInputError(f"Speed.own_derivatives must be one of {list(OWN_DERIVATIVES)} (0: off, 1: on every"
                                    f" device, cpu: on the CPU only), got {self.own_derivatives!r}")

    @classmethod
    def from_environment(cls) -> Speed:
        """The settings ``CEBM_CUDA_GRAPHS`` and ``CEBM_OWN_DERIVATIVES`` give now (the defaults where unset); a bad
        value is one line naming the variable and its choices."""
        graphs = os.environ.get("CEBM_CUDA_GRAPHS", "1").strip()
        if graphs not in ("0", "1"):
            raise InvalidInputError(f"CEBM_CUDA_GRAPHS={graphs!r} is not a valid setting; valid choices: ['0', '1']")
        derivatives = os.environ.get("CEBM_OWN_DERIVATIVES", "cpu").strip()
        if derivatives not in OWN_DERIVATIVES:
            raise InvalidInputError(f"CEBM_OWN_DERIVATIVES={derivatives!r} is not a valid setting; valid choices:"
                                    f" {list(OWN_DERIVATIVES)} (0: off, 1: on every device, cpu: on the CPU only)")
        return cls(graphs == "1", derivatives)  # type: ignore[arg-type]

    def own_derivatives_on(self, device_type: str) -> bool:
        """Whether the layers on a device of this type (``"cpu"``, ``"cuda"``, ...) state their own derivatives."""
        return self.own_derivatives == "1" or (self.own_derivatives == "cpu" and device_type == "cpu")
