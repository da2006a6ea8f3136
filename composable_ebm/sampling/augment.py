"""Data-augmentation transitions (Du et al. 2021, Section 3.3), batched per sample.

Every image in a batch gets its own random parameters, drawn from an explicit
``torch.Generator`` on the batch's own device; nothing loops over images in Python.
Colour jitter follows SimCLR (Chen et al. 2020): with strength ``s``, brightness,
contrast and saturation factors in ``[1 - 0.8 s, 1 + 0.8 s]`` and a hue shift in
``[-0.2 s, 0.2 s]`` of a turn, applied with probability 0.8, then grayscale with
probability 0.2; each component's range can also be set on its own (``hue=0.5`` with the
others at 0 rotates hue alone, keeping shape, size and position). Random resized crop and
horizontal flip are one affine resampling; Gaussian blur uses a per-sample sigma.

Which image properties an augmentation changes matters for conditional models: a
transition must never change the attribute a model is conditioned on (a colour model gets
no colour jitter, a position model no flip). `AugmentConfig.changes` names what a
setting changes, so a recipe can be checked against its attributes.
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

    color_strength: float = 1.0
    """SimCLR colour-jitter strength s (0 turns jitter off)"""
    color_prob: float = 0.8
    """probability of colour jitter per image"""
    brightness: float | None = None
    """factor range [1 - b, 1 + b]; None: 0.8 s"""
    contrast: float | None = None
    """factor range [1 - c, 1 + c]; None: 0.8 s"""
    saturation: float | None = None
    """factor range [1 - a, 1 + a]; None: 0.8 s"""
    hue: float | None = None
    """shift range [-h, h] of a turn, h <= 0.5; None: 0.2 s"""
    channel_permute_prob: float = 0.0
    """probability of a uniformly random RGB channel permutation per image"""
    grayscale_prob: float = 0.2
    """probability of grayscale per image"""
    flip_prob: float = 0.5
    """probability of a horizontal flip per image"""
    crop_scale: tuple[float, float] = (0.08, 1.0)
    """area fraction of the random resized crop (paper: 0.02-1 at 32px); above 1 the frame is larger than the
    image and zooms out, what lies outside the image repeating its border pixels (at most 16)"""
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    """aspect-ratio range of the crop"""
    crop_log_scale: bool = False
    """draw the crop's area log-uniformly in ``crop_scale`` (zooming in by a factor as likely as out by it over
    ``[1 / a, a]``), not uniformly (torchvision's RandomResizedCrop)"""
    blur_prob: float = 0.0
    """probability of Gaussian blur (authors' CelebA setting: 0.5)"""
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    """blur sigma range in pixels"""

    def __post_init__(self) -> None:
        for name in ("color_prob", "grayscale_prob", "flip_prob", "blur_prob", "channel_permute_prob"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
        lo, hi = self.crop_scale
        if not 0.0 < lo <= hi <= 16.0:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 16, got {self.crop_scale}")
        if not 0.0 < self.crop_ratio[0] <= self.crop_ratio[1]:
            raise ValueError(f"crop_ratio must satisfy 0 < low <= high, got {self.crop_ratio}")
        if not 0.0 <= self.color_strength <= 16.0:  # also refuses nan, which switched jitter off silently
            raise ValueError(f"color_strength must be a number in [0, 16], got {self.color_strength}")
        lo, hi = self.blur_sigma
        if not 0.0 < lo <= hi <= 64.0:  # a zero sigma makes every blurred sample fail in kornia
            raise ValueError(f"blur_sigma must satisfy 0 < low <= high <= 64, got {self.blur_sigma}")
        for name in ("brightness", "contrast", "saturation"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:  # nan fails too
                raise ValueError(f"{name} must be in [0, 1] (factor range [1 - v, 1 + v]), got {v}")
        if self.hue is not None and not 0.0 <= self.hue <= 0.5:
            raise ValueError(f"hue must be in [0, 0.5] (a shift of at most half a turn), got {self.hue}")

    def jitter_ranges(self) -> tuple[float, float, float, float]:
        """Brightness, contrast, saturation and hue ranges after applying ``color_strength`` defaults."""
        s = self.color_strength
        pick = lambda v, default: default if v is None else v  # noqa: E731
        return (
            pick(self.brightness, min(0.8 * s, 1.0)),
            pick(self.contrast, min(0.8 * s, 1.0)),
            pick(self.saturation, min(0.8 * s, 1.0)),
            pick(self.hue, min(0.2 * s, 0.5)),
        )

    def changes(self) -> frozenset[str]:
        """Image properties this setting can change: ``hue``, ``intensity`` (brightness, contrast,
        saturation, grayscale), ``mirror`` (left/right), ``scale``, ``translation``, ``blur``."""
        b, c, a, h = self.jitter_ranges()
        out = set()
        if (self.color_prob > 0 and h > 0) or self.channel_permute_prob > 0:
            out.add("hue")
        if (self.color_prob > 0 and max(b, c, a) > 0) or self.grayscale_prob > 0:
            out.add("intensity")
        if self.flip_prob > 0:
            out.add("mirror")
        if self.crop_scale != (1.0, 1.0) or self.crop_ratio != (1.0, 1.0):
            out.update({"scale", "translation"})
        if self.blur_prob > 0:
            out.add("blur")
        return frozenset(out)


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
    b, device = x.shape[0], x.device
    jitter = _bernoulli(b, cfg.color_prob, generator, device).view(-1, 1, 1, 1)
    rb, rc, rs, rh = cfg.jitter_ranges()
    if max(rb, rc, rs, rh) > 0:
        brightness = _uniform(b, 1 - rb, 1 + rb, generator, device)
        contrast = _uniform(b, 1 - rc, 1 + rc, generator, device)
        saturation = _uniform(b, 1 - rs, 1 + rs, generator, device)
        hue = _uniform(b, -rh, rh, generator, device)
        y = (x * brightness.view(-1, 1, 1, 1)).clamp(0, 1)
        y = _blend(y, _gray(y).mean(dim=(2, 3), keepdim=True), contrast)
        y = _blend(y, _gray(y), saturation)
        hsv = rgb_to_hsv(y)  # hue in radians, [0, 2 pi)
        h = torch.remainder(hsv[:, :1] + 2 * math.pi * hue.view(-1, 1, 1, 1), 2 * math.pi)
        y = hsv_to_rgb(torch.cat([h, hsv[:, 1:]], dim=1)).clamp(0, 1)
        x = torch.where(jitter, y, x)
    gray = _bernoulli(b, cfg.grayscale_prob, generator, device).view(-1, 1, 1, 1)
    return torch.where(gray, _gray(x).expand_as(x), x)


_PERMUTATIONS = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))


def permute_channels(x: Tensor, cfg: AugmentConfig, generator: torch.Generator) -> Tensor:
    """With probability ``channel_permute_prob``, a uniformly random permutation of the RGB channels."""
    b, device = x.shape[0], x.device
    perms = torch.tensor(_PERMUTATIONS, device=device)
    choice = perms[torch.randint(len(_PERMUTATIONS), (b,), generator=generator, device=device)]  # (B, 3)
    apply = _bernoulli(b, cfg.channel_permute_prob, generator, device)
    choice = torch.where(apply.unsqueeze(1), choice, perms[0].expand_as(choice))
    index = choice.view(b, 3, 1, 1).expand_as(x)
    return x.gather(1, index)


def resized_crop_and_flip(x: Tensor, cfg: AugmentConfig, generator: torch.Generator) -> Tensor:
    """Random resized crop (area in ``crop_scale``, aspect in ``crop_ratio``; an area above 1 zooms out) and
    horizontal flip, one resampling."""
    b, device = x.shape[0], x.device
    if cfg.crop_log_scale:
        area = torch.exp(_uniform(b, math.log(cfg.crop_scale[0]), math.log(cfg.crop_scale[1]), generator, device))
    else:
        area = _uniform(b, *cfg.crop_scale, generator, device)
    log_ratio = _uniform(b, math.log(cfg.crop_ratio[0]), math.log(cfg.crop_ratio[1]), generator, device)
    ratio = torch.exp(log_ratio)
    side = area.sqrt().clamp(min=1.0)  # a crop's sides stay within the image's; a larger frame's within sqrt(area)
    w = torch.minimum(torch.sqrt(area * ratio), side)  # frame width / image width
    h = torch.minimum(torch.sqrt(area / ratio), side)
    # centre in [-1, 1] coordinates: a crop lies inside the image, a larger frame holds the whole image
    cx = (1 - w) * (2 * torch.rand(b, generator=generator, device=device) - 1)
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
    changes = cfg.changes()
    if changes & {"mirror", "scale", "translation"}:
        x = resized_crop_and_flip(x, cfg, generator)
    if x.shape[1] == 3 and cfg.channel_permute_prob > 0:
        x = permute_channels(x, cfg, generator)
    if x.shape[1] == 3 and (cfg.color_prob > 0 and max(cfg.jitter_ranges()) > 0 or cfg.grayscale_prob > 0):
        x = color_jitter(x, cfg, generator)
    if cfg.blur_prob > 0:
        x = gaussian_blur(x, cfg, generator)
    return x.clamp(0, 1)
