"""Analytic energies with known normalisers, for tests and toy problems."""

from __future__ import annotations

import torch
from torch import Tensor

from composable_ebm.energy import Energy, Labels
from composable_ebm.pipeline import FORMS  # noqa: F401  (importing the pipeline installs Energy.sample)


class GaussianEnergy(Energy):
    """``E(x) = 0.5 (x - mu)^T P (x - mu)`` with precision ``P = cov^{-1}``: ``exp(-E)`` is ``N(mu, cov)``."""

    def __init__(self, mean: Tensor, cov: Tensor, name: str = "gaussian") -> None:
        mean = torch.as_tensor(mean, dtype=torch.float32)
        cov = torch.as_tensor(cov, dtype=torch.float32)
        if mean.ndim != 1 or cov.shape != (mean.numel(), mean.numel()):
            raise ValueError(f"mean must be (D,) and cov (D, D); got {tuple(mean.shape)} and {tuple(cov.shape)}")
        super().__init__((mean.numel(),), value_range=None)
        self.register_buffer("mean", mean)
        self.register_buffer("precision", torch.linalg.inv(cov))
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def energy(self, x: Tensor, labels: Labels | None) -> Tensor:
        """Half the squared Mahalanobis distance to the mean, ``(B,)``."""
        d = x - self.mean
        return 0.5 * torch.einsum("bi,ij,bj->b", d, self.precision.to(x.dtype), d)
