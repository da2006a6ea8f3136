"""OOD AUROC, FID and Inception score.

- AUROC (Du et al. 2021, Table 3): in-distribution images should score higher under
  ``-E(x)``; computed exactly by the rank-sum (Mann-Whitney U) statistic, ties counted half.
- FID (Heusel et al. 2017): Fréchet distance between Gaussian fits of two feature sets, with
  the matrix square root taken stably in float64 through a symmetric eigendecomposition.
- Inception score (Salimans et al. 2016): ``exp E_x KL(p(y|x) || p(y))``.

Feature networks are pluggable: any ``nn.Module`` or callable mapping images to ``(B, D)``
features; `InceptionV3Features` wraps torchvision's Inception v3 with weights the user
supplies.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composable_ebm.energy import Energy, Labels
from composable_ebm.errors import ModelFileError
from composable_ebm.images import as_float_images

FeatureFn = Callable[[Tensor], Tensor]


# ----------------------------------------------------------------------------- AUROC
def auroc(scores_in: Tensor, scores_out: Tensor) -> float:
    """P(score_in > score_out) + 0.5 P(tie): the area under the ROC curve."""
    scores_in, scores_out = scores_in.detach().double().flatten().cpu(), scores_out.detach().double().flatten().cpu()
    if scores_in.numel() == 0 or scores_out.numel() == 0:
        raise ValueError("AUROC needs at least one in-distribution and one out-of-distribution score")
    if not (torch.isfinite(scores_in).all() and torch.isfinite(scores_out).all()):
        raise ValueError("AUROC got non-finite scores")
    both = torch.cat([scores_in, scores_out])
    # average ranks (1-based) with ties sharing the mean rank
    values, inverse, counts = torch.unique(both, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    mean_rank = ends - (counts.double() - 1) / 2
    ranks = mean_rank[inverse]
    n_in, n_out = scores_in.numel(), scores_out.numel()
    u = ranks[:n_in].sum() - n_in * (n_in + 1) / 2
    return float(u / (n_in * n_out))


@torch.no_grad()
def _energies(energy: Energy, x: Tensor, labels: Labels | None, batch_size: int) -> Tensor:
    device = energy.device
    out = []
    for i in range(0, x.shape[0], batch_size):
        chunk = as_float_images(x[i : i + batch_size].to(device))
        sub = {a: v[i : i + batch_size].to(device) for a, v in labels.items()} if labels else None
        out.append(energy(chunk, sub).cpu())
    return torch.cat(out)


def ood_auroc(energy: Energy, x_in: Tensor, x_out: Tensor, batch_size: int = 256) -> float:
    """AUROC of ``-E(x)`` separating in-distribution ``x_in`` from out-of-distribution ``x_out``."""
    return auroc(-_energies(energy, x_in, None, batch_size), -_energies(energy, x_out, None, batch_size))


# ------------------------------------------------------------------------------- FID
def gaussian_stats(features: Tensor) -> tuple[Tensor, Tensor]:
    """Mean ``(D,)`` and unbiased covariance ``(D, D)`` in float64."""
    f = features.detach().double().cpu()
    if f.ndim != 2 or f.shape[0] < 2:
        raise ValueError(f"need features of shape (N >= 2, D), got {tuple(f.shape)}")
    return f.mean(0), torch.cov(f.T).reshape(f.shape[1], f.shape[1])


def _sqrt_psd(m: Tensor) -> Tensor:
    vals, vecs = torch.linalg.eigh((m + m.T) / 2)
    return (vecs * vals.clamp_min(0).sqrt()) @ vecs.T


def frechet_distance(mu1: Tensor, cov1: Tensor, mu2: Tensor, cov2: Tensor) -> float:
    """``|mu1 - mu2|^2 + tr(C1 + C2 - 2 (C1^1/2 C2 C1^1/2)^1/2)``, all in float64.

    ``tr sqrtm(C1 C2)`` equals the trace of the PSD square root of ``C1^1/2 C2 C1^1/2``,
    which a symmetric eigendecomposition computes without complex parts.
    """
    mu1, mu2, cov1, cov2 = (t.double() for t in (mu1, mu2, cov1, cov2))
    s1 = _sqrt_psd(cov1)
    middle = s1 @ cov2 @ s1
    tr_sqrt = torch.linalg.eigvalsh((middle + middle.T) / 2).clamp_min(0).sqrt().sum()
    return float((mu1 - mu2).pow(2).sum() + torch.trace(cov1) + torch.trace(cov2) - 2 * tr_sqrt)


@torch.no_grad()
def extract_features(images: Tensor, feature_fn: FeatureFn, batch_size: int = 100, device: torch.device | str | None = None,
                     progress: bool = False) -> Tensor:
    """Features ``(N, D)`` of images ``(N, C, H, W)`` (uint8 or float in [0, 1]), in batches (with a progress bar)."""
    if device is None and isinstance(feature_fn, nn.Module):
        device = next(feature_fn.parameters()).device
    out = []
    chunks = images.split(batch_size)
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, desc="features", leave=False, disable=None)  # terminals only
    for chunk in chunks:
        chunk = as_float_images(chunk)
        out.append(feature_fn(chunk.to(device) if device is not None else chunk).flatten(1).double().cpu())
    return torch.cat(out)


def fid(real: Tensor, fake: Tensor, feature_fn: FeatureFn, batch_size: int = 100) -> float:
    """FID between two image sets under ``feature_fn``."""
    m1, c1 = gaussian_stats(extract_features(real, feature_fn, batch_size))
    m2, c2 = gaussian_stats(extract_features(fake, feature_fn, batch_size))
    return frechet_distance(m1, c1, m2, c2)


# ---------------------------------------------------------------------- Inception score
def inception_score_from_probs(probs: Tensor, splits: int = 10) -> tuple[float, float]:
    """Mean and std over ``splits`` of ``exp(E KL(p(y|x) || p(y)))`` from class probabilities ``(N, K)``."""
    p = probs.detach().double().cpu()
    if p.ndim != 2 or (p < 0).any() or not torch.allclose(p.sum(1), torch.ones(p.shape[0], dtype=p.dtype), atol=1e-4):
        raise ValueError("inception score needs class probabilities of shape (N, K) whose rows sum to 1")
    scores = []
    for part in p.chunk(splits):
        marginal = part.mean(0, keepdim=True)
        kl = (part * (torch.log(part.clamp_min(1e-12)) - torch.log(marginal.clamp_min(1e-12)))).sum(1)
        scores.append(torch.exp(kl.mean()))
    s = torch.stack(scores)
    return float(s.mean()), float(s.std()) if s.numel() > 1 else 0.0


# ------------------------------------------------------------------------ Inception v3
TORCH_HUB_INCEPTION = "inception_v3_google-0cc3c7bd.pth"


def find_inception_weights(path: str | os.PathLike | None = None) -> Path:
    """The user's Inception v3 weights: ``path``, or torchvision's file in the torch hub cache."""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"Inception v3 weights not found at {p}")
        return p
    cached = Path(torch.hub.get_dir()) / "checkpoints" / TORCH_HUB_INCEPTION
    if cached.is_file():
        return cached
    raise FileNotFoundError(
        f"no Inception v3 weights: pass a weights file, or place torchvision's {TORCH_HUB_INCEPTION} in {cached.parent}."
        " Without them, use any feature network (e.g. an AttributeClassifier's .features) for FID."
    )


class InceptionV3Features(nn.Module):
    """torchvision's Inception v3 as a feature network: 2048-d pool features and 1000-way probabilities.

    Weights come from a local file (safetensors, or a torch checkpoint read with
    ``weights_only=True``) and are loaded strictly. Images in ``[0, 1]`` are resized to
    299x299 and normalised with ImageNet statistics. FIDs computed with torchvision's
    ImageNet weights are not numerically comparable to papers' FIDs, which use the
    TensorFlow Inception graph (pytorch-fid's ``pt_inception`` port).
    """

    def __init__(self, weights: str | os.PathLike | None = None) -> None:
        super().__init__()
        from torchvision.models import inception_v3

        path = find_inception_weights(weights)
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            from composable_ebm.training.checkpoint import torch_file

            state = torch_file(path, "cpu", "weights file")
            if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
                raise ModelFileError(f"{path}: holds {type(state).__name__}, not a dict of weight tensors")
        has_aux = any(k.startswith("AuxLogits.") for k in state)
        self.net = inception_v3(weights=None, aux_logits=has_aux, init_weights=False)
        self.net.load_state_dict(state, strict=True)
        self.net.eval()
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))

    def _trunk(self, x: Tensor) -> Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        x = F.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False)
        x = (x - self.mean) / self.std
        net = self.net
        for name in ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1",
                     "Conv2d_4a_3x3", "maxpool2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b",
                     "Mixed_6c", "Mixed_6d", "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c", "avgpool"):
            x = getattr(net, name)(x)
        return x.flatten(1)  # (B, 2048)

    def forward(self, x: Tensor) -> Tensor:
        """Pool features ``(B, 2048)``, the standard FID features."""
        return self._trunk(x)

    def probabilities(self, x: Tensor) -> Tensor:
        """Class probabilities ``(B, 1000)`` for the Inception score."""
        return torch.softmax(self.net.fc(self._trunk(x)), dim=1)


@torch.no_grad()
def inception_score(images: Tensor, network: InceptionV3Features, batch_size: int = 100, splits: int = 10) -> tuple[float, float]:
    """Inception score of images ``(N, C, H, W)`` in ``[0, 1]`` under ``network``."""
    device = next(network.parameters()).device
    probs = torch.cat([network.probabilities(c.float().to(device)).cpu() for c in images.split(batch_size)])
    return inception_score_from_probs(probs, splits)
