"""Data-augmentation transitions (Du et al. 2021, Section 3.3), batched per sample.

Every image in a batch gets its own random parameters, drawn from an explicit
``torch.Generator`` on the batch's own device; nothing loops over images in Python.
Colour jitter follows SimCLR (Chen et al. 2020): with strength ``s``, brightness,
contrast and saturation factors in ``[1 - 0.8 s, 1 + 0.8 s]`` and a hue shift in
``[-0.2 s, 0.2 s]`` of a turn, applied with probability 0.8, then grayscale with
probability 0.2. Random resized crop and horizontal flip are one affine resampling;
Gaussian blur uses a per-sample sigma.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from kornia.color import hsv_to_rgb, rgb_to_hsv
from kornia.filters import gaussian_blur2d
from torch import Tensor


@dataclass(frozen=True)
class AugmentConfig:
    """Settings of one augmentation transition (the appendix's per-dataset choices live in recipes)."""

    color_strength: float = 1.0  # SimCLR colour-jitter strength s (0 turns jitter off)
    color_prob: float = 0.8  # probability of colour jitter per image
    grayscale_prob: float = 0.2  # probability of grayscale per image
    flip_prob: float = 0.5  # probability of a horizontal flip per image
    crop_scale: tuple[float, float] = (0.08, 1.0)  # area fraction of the random resized crop (paper: 0.02-1 at 32px)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)  # aspect-ratio range of the crop
    blur_prob: float = 0.0  # probability of Gaussian blur (authors' CelebA setting: 0.5)
    blur_sigma: tuple[float, float] = (0.1, 2.0)  # blur sigma range in pixels

    def __post_init__(self) -> None:
        for name in ("color_prob", "grayscale_prob", "flip_prob", "blur_prob"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
        lo, hi = self.crop_scale
        if not 0.0 < lo <= hi <= 1.0:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale}")
        if not 0.0 < self.crop_ratio[0] <= self.crop_ratio[1]:
            raise ValueError(f"crop_ratio must satisfy 0 < low <= high, got {self.crop_ratio}")
        if self.color_strength < 0:
            raise ValueError(f"color_strength must be >= 0, got {self.color_strength}")


def _uniform(n: int, low: float, high: float, generator: torch.Generator, device: torch.device) -> Tensor:
    return low + (high - low) * torch.rand(n, generator=generator, device=device)


def _bernoulli(n: int, p: float, generator: torch.Generator, device: torch.device) -> Tensor:
    return torch.rand(n, generator=generator, device=device) < p


def _gray(x: Tensor) -> Tensor:
    """ITU-R 601 luma, ``(B, 1, H, W)``."""
    r, g, b = x.unbind(dim=1)
    return (0.299 * r + 0.587 * g + 0.114 * b).unsqueeze(1)


def _blend(x: Tensor, other: Tensor, factor: Tensor) -> Tensor:
    return (factor.view(-1, 1, 1, 1) * x + (1 - factor.view(-1, 1, 1, 1)) * other).clamp(0, 1)


def color_jitter(x: Tensor, cfg: AugmentConfig, generator: torch.Generator) -> Tensor:
    """SimCLR colour distortion of strength ``cfg.color_strength`` on RGB images in ``[0, 1]``."""
    b, device, s = x.shape[0], x.device, cfg.color_strength
    jitter = _bernoulli(b, cfg.color_prob, generator, device).view(-1, 1, 1, 1)
    if s > 0:
        lo, hi = max(0.0, 1 - 0.8 * s), 1 + 0.8 * s
        brightness = _uniform(b, lo, hi, generator, device)
        contrast = _uniform(b, lo, hi, generator, device)
        saturation = _uniform(b, lo, hi, generator, device)
        hue = _uniform(b, -min(0.2 * s, 0.5), min(0.2 * s, 0.5), generator, device)
        y = (x * brightness.view(-1, 1, 1, 1)).clamp(0, 1)
        y = _blend(y, _gray(y).mean(dim=(2, 3), keepdim=True), contrast)
        y = _blend(y, _gray(y), saturation)
        hsv = rgb_to_hsv(y)  # hue in radians, [0, 2 pi)
        h = torch.remainder(hsv[:, :1] + 2 * math.pi * hue.view(-1, 1, 1, 1), 2 * math.pi)
        y = hsv_to_rgb(torch.cat([h, hsv[:, 1:]], dim=1)).clamp(0, 1)
        x = torch.where(jitter, y, x)
    gray = _bernoulli(b, cfg.grayscale_prob, generator, device).view(-1, 1, 1, 1)
    return torch.where(gray, _gray(x).expand_as(x), x)


def resized_crop_and_flip(x: Tensor, cfg: AugmentConfig, generator: torch.Generator) -> Tensor:
    """Random resized crop (area in ``crop_scale``, aspect in ``crop_ratio``) and horizontal flip, one resampling."""
    b, device = x.shape[0], x.device
    area = _uniform(b, *cfg.crop_scale, generator, device)
    log_ratio = _uniform(b, math.log(cfg.crop_ratio[0]), math.log(cfg.crop_ratio[1]), generator, device)
    ratio = torch.exp(log_ratio)
    w = torch.sqrt(area * ratio).clamp(max=1.0)  # crop width / image width
    h = torch.sqrt(area / ratio).clamp(max=1.0)
    cx = (1 - w) * (2 * torch.rand(b, generator=generator, device=device) - 1)  # centre in [-1, 1] coords
    cy = (1 - h) * (2 * torch.rand(b, generator=generator, device=device) - 1)
    flip = torch.where(_bernoulli(b, cfg.flip_prob, generator, device), -1.0, 1.0)
    theta = torch.zeros(b, 2, 3, device=device, dtype=x.dtype)
    theta[:, 0, 0] = w * flip
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = h
    theta[:, 1, 2] = cy
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def gaussian_blur(x: Tensor, cfg: AugmentConfig, generator: torch.Generator) -> Tensor:
    """Gaussian blur with probability ``blur_prob``; per-image sigma; kernel about 10% of the image (SimCLR)."""
    b, device = x.shape[0], x.device
    apply = _bernoulli(b, cfg.blur_prob, generator, device).view(-1, 1, 1, 1)
    sigma = _uniform(b, *cfg.blur_sigma, generator, device)
    size = max(3, int(0.1 * x.shape[-1]) // 2 * 2 + 1)
    blurred = gaussian_blur2d(x, (size, size), torch.stack([sigma, sigma], dim=1).to(x.dtype))
    return torch.where(apply, blurred, x)


def augment(x: Tensor, cfg: AugmentConfig, generator: torch.Generator) -> Tensor:
    """One augmentation transition on a batch ``(B, C, H, W)`` in ``[0, 1]``, independent per image."""
    if x.ndim != 4:
        raise ValueError(f"augmentation needs image batches (B, C, H, W), got shape {tuple(x.shape)}")
    x = resized_crop_and_flip(x, cfg, generator)
    if x.shape[1] == 3:
        x = color_jitter(x, cfg, generator)
    if cfg.blur_prob > 0:
        x = gaussian_blur(x, cfg, generator)
    return x.clamp(0, 1)
