"""Analytic energies with known normalisers, for tests and toy problems."""

from __future__ import annotations

import torch
from torch import Tensor

from composable_ebm.energy import Energy, Labels, NoiseConditioned


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


class NoisedGaussianEnergy(_Gaussian, NoiseConditioned):
    """A noise-conditioned Gaussian: ``N(mu, cov)`` blurred by Gaussian noise of std ``sigma`` is
    ``N(mu, cov + sigma^2 I)``, whose energy (``0.5 (x - mu)^T (cov + sigma^2 I)^{-1} (x - mu)``) this is at every
    level; without a level, at ``sigma_min``. The exact model a denoising score matcher would learn of Gaussian data,
    so annealed samplers can be checked against closed forms at every level; it was trained on no levels
    (`noise_range` is ``None``)."""

    def __init__(self, mean: Tensor, cov: Tensor, sigma_min: float = 0.01, name: str = "noised-gaussian") -> None:
        super().__init__(mean, cov, name)
        if not torch.allclose(self.cov, self.cov.T):
            raise ValueError(f"cov must be symmetric; got {self.cov.tolist()}")
        self.sigma_min = float(sigma_min)
        # cov = V diag(lam) V^T, so (cov + sigma^2 I)^{-1} = V diag(1 / (lam + sigma^2)) V^T at every level: products
        # and sums only (no solve, which reads its status back to the host and cannot be captured in a CUDA graph)
        eigenvalues, eigenvectors = torch.linalg.eigh(self.cov)
        self.register_buffer("eigenvalues", eigenvalues)
        self.register_buffer("eigenvectors", eigenvectors)

    def covariance(self, sigma: float) -> Tensor:
        """``cov + sigma^2 I``: the covariance of the data at noise level ``sigma``."""
        return self.cov + sigma * sigma * torch.eye(self.cov.shape[0], device=self.cov.device)

    def energy(self, x: Tensor, labels: Labels | None, sigma: Tensor | None = None) -> Tensor:
        """Half the squared Mahalanobis distance under ``cov + sigma^2 I``, per item's level, ``(B,)``."""
        if sigma is None:
            sigma = torch.full((x.shape[0],), self.sigma_min, device=x.device, dtype=x.dtype)
        along = (x - self.mean.to(x.dtype)) @ self.eigenvectors.to(x.dtype)  # (B, D): along the eigenvectors
        return 0.5 * (along**2 / (self.eigenvalues.to(x.dtype) + sigma.view(-1, 1) ** 2)).sum(dim=1)
