"""Standard 2-D toy densities with unnormalised log-densities, for exact KL on a grid.

Each density has a sampler and an (unnormalised) log-density, so ``KL(data || model)`` can
be computed on a fine grid with both densities normalised numerically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from composable_ebm.configs import check_size
from composable_ebm.data.base import DataConfig, dataset
from composable_ebm.errors import InvalidInputError

TOY_DENSITIES = ("8gaussians", "rings", "checkerboard", "2spirals")
BOX = 4.0  # every density lives in [-BOX, BOX]^2


def _check(name: str) -> None:
    if name not in TOY_DENSITIES:
        raise ValueError(f"unknown toy density {name!r}; valid choices: {list(TOY_DENSITIES)}")


def _eight_centres() -> Tensor:
    angles = torch.arange(8) * (2 * math.pi / 8)
    return 2.5 * torch.stack([angles.cos(), angles.sin()], dim=1)


_SIGMA_8G, _RING_RADII, _SIGMA_RING, _SIGMA_SPIRAL = 0.3, (1.0, 2.0, 3.0), 0.15, 0.2


def sample_toy(name: str, n: int, generator: torch.Generator) -> Tensor:
    """``n`` points ``(n, 2)`` from the named density."""
    _check(name)
    u = lambda *shape: torch.rand(*shape, generator=generator)  # noqa: E731
    z = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    if name == "8gaussians":
        idx = torch.randint(8, (n,), generator=generator)
        return _eight_centres()[idx] + _SIGMA_8G * z(n, 2)
    if name == "rings":
        radii = torch.tensor(_RING_RADII)
        # rings weighted by circumference, so the density is uniform in angle along each ring
        r = radii[torch.multinomial(radii / radii.sum(), n, replacement=True, generator=generator)]
        angle = 2 * math.pi * u(n)
        rr = r + _SIGMA_RING * z(n)
        return torch.stack([rr * angle.cos(), rr * angle.sin()], dim=1)
    if name == "checkerboard":
        # uniform on the dark squares of a 4x4 board over [-4, 4]^2
        x = 8 * u(n) - 4
        col = torch.floor((x + 4) / 2)
        row = 2 * torch.randint(2, (n,), generator=generator) + (col.long() % 2 == 0).long()
        y = -4 + 2 * row + 2 * u(n)
        return torch.stack([x, y.float()], dim=1)
    # 2spirals
    t = 3 * math.pi * torch.sqrt(u(n))  # more points further out, uniform along the arc
    sign = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0)
    r = t / (3 * math.pi) * 3.5
    pts = torch.stack([r * t.cos(), r * t.sin()], dim=1) * sign[:, None]
    return pts + _SIGMA_SPIRAL * z(n, 2)


def toy_log_density(name: str, x: Tensor) -> Tensor:
    """Unnormalised log-density at points ``(N, 2)``; ``-inf`` where the density is zero.

    For 2spirals (no closed form) it is a Gaussian kernel density over a dense arc sample.
    """
    _check(name)
    if name == "8gaussians":
        d2 = (x[:, None] - _eight_centres()[None].to(x)).pow(2).sum(-1)
        return torch.logsumexp(-d2 / (2 * _SIGMA_8G**2), dim=1)
    if name == "rings":
        r = x.norm(dim=1, keepdim=True)
        radii = torch.tensor(_RING_RADII, dtype=x.dtype)
        # ring density ∝ weight / (2 pi r) * N(|x| - R; sigma); weights ∝ R make it uniform per unit length
        per_ring = -((r - radii) ** 2) / (2 * _SIGMA_RING**2) - torch.log(r.clamp_min(1e-6))
        return torch.logsumexp(per_ring, dim=1)
    if name == "checkerboard":
        inside = (x.abs() <= 4).all(dim=1)
        col, row = torch.floor((x[:, 0] + 4) / 2).long(), torch.floor((x[:, 1] + 4) / 2).long()
        dark = (col + row) % 2 == 1
        return torch.where(inside & dark, 0.0, -torch.inf).to(x.dtype)
    t = torch.linspace(0, 3 * math.pi, 2000, dtype=x.dtype)
    r = t / (3 * math.pi) * 3.5
    arc = torch.stack([r * t.cos(), r * t.sin()], dim=1)
    centres = torch.cat([arc, -arc])
    weights = torch.log(torch.cat([t, t]) + 1e-3)  # arc density grows with t (matches sqrt(u) above)
    d2 = (x[:, None] - centres[None]).pow(2).sum(-1)
    return torch.logsumexp(weights - d2 / (2 * _SIGMA_SPIRAL**2), dim=1)


def grid(resolution: int = 200, box: float = BOX) -> tuple[Tensor, float]:
    """Cell centres ``(resolution^2, 2)`` covering ``[-box, box]^2`` and the cell area."""
    step = 2 * box / resolution
    ticks = -box + step * (torch.arange(resolution, dtype=torch.float64) + 0.5)
    xx, yy = torch.meshgrid(ticks, ticks, indexing="xy")
    return torch.stack([xx.flatten(), yy.flatten()], dim=1), step * step


def kl_on_grid(log_p_data: Tensor, log_p_model: Tensor) -> float:
    """``KL(data || model)`` with both unnormalised log-densities normalised over the same grid cells."""
    lp = log_p_data.double() - torch.logsumexp(log_p_data.double(), 0)
    lq = log_p_model.double() - torch.logsumexp(log_p_model.double(), 0)
    p = lp.exp()
    mask = p > 0
    return float((p[mask] * (lp[mask] - lq[mask])).sum())


@dataset("toy2d")
@dataclass(frozen=True)
class ToyData(DataConfig):
    """Recipe settings of a 2-D toy density (``[data] dataset = "toy2d"``): points, no attributes."""

    density: str = "8gaussians"
    """one of `TOY_DENSITIES`"""
    n: int = 10000
    """number of points"""
    seed: int = 0
    """seed of the draw"""

    def __post_init__(self) -> None:
        if self.density not in TOY_DENSITIES:
            raise InvalidInputError(f"unknown toy density {self.density!r}; valid choices: {list(TOY_DENSITIES)}")
        check_size("ToyData", "n", self.n, high=1 << 26)
        check_size("ToyData", "seed", self.seed, low=0, high=2**62)
        if self.attributes:
            raise InvalidInputError(f"toy2d has no attributes to condition on, got {list(self.attributes)}; valid"
                                    " choices: attributes = []")

    def build(self, base: Path | None = None) -> Tensor:
        return sample_toy(self.density, self.n, torch.Generator().manual_seed(self.seed))
