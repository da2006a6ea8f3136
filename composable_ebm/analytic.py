"""Analytic energies with known normalisers, for tests and toy problems."""

from __future__ import annotations

import torch
from torch import Tensor

from composable_ebm.energy import Energy, Labels
from composable_ebm.pipeline import FORMS  # noqa: F401  (importing the pipeline installs Energy.sample)


class _Gaussian(Energy):
    """An unbounded energy on ``(D,)`` vectors with a mean ``(D,)`` buffer, a covariance ``(D, D)`` and a name."""

    def __init__(self, mean: Tensor, cov: Tensor, name: str) -> None:
        mean = torch.as_tensor(mean, dtype=torch.float32)
        cov = torch.as_tensor(cov, dtype=torch.float32)
        if mean.ndim != 1 or cov.shape != (mean.numel(), mean.numel()):
            raise ValueError(f"mean must be (D,) and cov (D, D); got {tuple(mean.shape)} and {tuple(cov.shape)}")
        super().__init__((mean.numel(),), value_range=None)
        self.register_buffer("mean", mean)
        self.register_buffer("cov", cov)
        self._name = name

    @property
    def name(self) -> str:
        return self._name


class GaussianEnergy(_Gaussian):
    """``E(x) = 0.5 (x - mu)^T P (x - mu)`` with precision ``P = cov^{-1}``: ``exp(-E)`` is ``N(mu, cov)``."""

    def __init__(self, mean: Tensor, cov: Tensor, name: str = "gaussian") -> None:
        super().__init__(mean, cov, name)
        self.register_buffer("precision", torch.linalg.inv(self.cov))

    def energy(self, x: Tensor, labels: Labels | None) -> Tensor:
        """Half the squared Mahalanobis distance to the mean, ``(B,)``."""
        d = x - self.mean
        return 0.5 * torch.einsum("bi,ij,bj->b", d, self.precision.to(x.dtype), d)


class NoisedGaussianEnergy(_Gaussian):
    """A noise-conditioned Gaussian: ``N(mu, cov)`` blurred by Gaussian noise of std ``sigma`` is
    ``N(mu, cov + sigma^2 I)``, whose energy (``0.5 (x - mu)^T (cov + sigma^2 I)^{-1} (x - mu)``) this is at every
    level; without a level, at ``sigma_min``. The exact model a denoising score matcher would learn of Gaussian data,
    so annealed samplers can be checked against closed forms at every level."""

    takes_noise_level = True

    def __init__(self, mean: Tensor, cov: Tensor, sigma_min: float = 0.01, name: str = "noised-gaussian") -> None:
        super().__init__(mean, cov, name)
        self.sigma_min = float(sigma_min)

    def covariance(self, sigma: float) -> Tensor:
        """``cov + sigma^2 I``: the covariance of the data at noise level ``sigma``."""
        return self.cov + sigma * sigma * torch.eye(self.cov.shape[0], device=self.cov.device)

    def energy(self, x: Tensor, labels: Labels | None, sigma: Tensor | None = None) -> Tensor:
        """Half the squared Mahalanobis distance under ``cov + sigma^2 I``, per item's level, ``(B,)``."""
        if sigma is None:
            sigma = torch.full((x.shape[0],), self.sigma_min, device=x.device, dtype=x.dtype)
        eye = torch.eye(self.cov.shape[0], device=x.device, dtype=x.dtype)
        cov = self.cov.to(x.dtype) + sigma.view(-1, 1, 1) ** 2 * eye  # (B, D, D)
        d = x - self.mean.to(x.dtype)
        return 0.5 * (d * torch.linalg.solve(cov, d.unsqueeze(-1)).squeeze(-1)).sum(dim=1)
