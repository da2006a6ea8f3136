"""Do samples look like the data? Two numbers and a picture.

- **FID ratio**: the Fréchet distance (Heusel et al. 2017) of ``N`` samples to a reference set of
  real images, in a feature network's space (an attribute classifier's penultimate features, say), divided by the *floor*: the same distance for ``N`` fresh real images. With few
  samples FID is biased upwards; the ratio cancels that bias, so 1 means "as close as real
  images of the same number" whatever ``N`` is.
- **High-frequency ratio**: mean absolute discrete Laplacian of the samples over that of real
  images. Speckle, stripes and fringes raise it; flat-coloured shapes on a flat background keep
  it low. A ratio near 1 means as much fine structure as the data, no more.
- **Contact sheet**: samples beside real images, upscaled with nearest-neighbour so a person sees
  every pixel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from composable_ebm.evaluation.metrics import FeatureFn, extract_features, frechet_distance, gaussian_stats
from composable_ebm.images import as_float_images

_LAPLACIAN = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]])


def high_frequency_energy(images: Tensor) -> Tensor:
    """Mean absolute discrete Laplacian of each image ``(B,)`` (interior pixels, all channels)."""
    x = as_float_images(images)
    c = x.shape[1]
    kernel = _LAPLACIAN.to(x.device, x.dtype).expand(c, 1, 3, 3)
    return F.conv2d(x, kernel, groups=c).abs().flatten(1).mean(dim=1)


@dataclass
class RealismScore:
    """How far ``n`` samples are from real images, in units of what ``n`` real images score."""

    n: int
    fid: float  # samples vs reference
    fid_floor: float  # n fresh real images vs the same reference
    hf: float  # mean |Laplacian| of the samples
    hf_data: float  # the same for the fresh real images

    @property
    def fid_ratio(self) -> float:
        return self.fid / max(self.fid_floor, 1e-12)

    @property
    def hf_ratio(self) -> float:
        return self.hf / max(self.hf_data, 1e-12)


def realism(samples: Tensor, real: Tensor, reference: Tensor, feature_fn: FeatureFn) -> RealismScore:
    """FID and high-frequency energy of ``samples`` against ``reference``, with ``real`` (fresh real
    images, a whole multiple of the samples' number) giving the floor of both.

    Args:
        samples: ``(N, C, H, W)`` in ``[0, 1]``.
        real: ``(k N, C, H, W)`` real images not in ``reference``; the floor is the mean FID of its
            ``k`` disjoint sets of ``N`` (with ``N`` = 64 one set's FID varies by a factor of 2 or more).
        reference: ``(M, C, H, W)`` real images, ``M`` larger than ``N`` for a stable estimate.
        feature_fn: images -> ``(B, D)`` features.
    """
    n = samples.shape[0]
    if real.shape[0] < n or real.shape[0] % n:
        raise ValueError(f"the floor needs a whole multiple of the {n} samples in real images, got {real.shape[0]}")
    ref = gaussian_stats(extract_features(reference, feature_fn))
    fake = gaussian_stats(extract_features(samples, feature_fn))
    floors = [frechet_distance(*gaussian_stats(extract_features(chunk, feature_fn)), *ref) for chunk in real.split(n)]
    return RealismScore(
        n=n,
        fid=frechet_distance(*fake, *ref),
        fid_floor=sum(floors) / len(floors),
        hf=float(high_frequency_energy(samples).mean()),
        hf_data=float(high_frequency_energy(real).mean()),
    )


def contact_sheet(rows: list[tuple[Tensor, Tensor]], per_row: int = 8, scale: int = 4, gap: int = 4) -> Tensor:
    """One image ``(3, H, W)``: for each ``(samples, real)`` pair a row of ``per_row`` samples, a gap,
    then ``per_row`` real images; every pixel upscaled ``scale`` times (nearest neighbour)."""
    lines = []
    for samples, real in rows:
        s, r = as_float_images(samples[:per_row]).cpu(), as_float_images(real[:per_row]).cpu()
        if s.shape[1] == 1:
            s, r = s.expand(-1, 3, -1, -1), r.expand(-1, 3, -1, -1)
        h = s.shape[-1]
        pad = torch.ones(3, h, 1)
        left = torch.cat([torch.cat([img, pad], dim=2) for img in s], dim=2)
        right = torch.cat([torch.cat([img, pad], dim=2) for img in r], dim=2)
        lines.append(torch.cat([left, torch.ones(3, h, gap), right], dim=2))
        lines.append(torch.ones(3, 1, lines[-1].shape[2]))
    width = max(line.shape[2] for line in lines)
    lines = [F.pad(line, (0, width - line.shape[2]), value=1.0) for line in lines]
    sheet = torch.cat(lines, dim=1)
    return sheet.repeat_interleave(scale, dim=1).repeat_interleave(scale, dim=2)
