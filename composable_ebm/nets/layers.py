"""Building blocks of the paper's ResNet energies (Du et al. 2021, appendix "Model Architectures").

One configurable residual block (group norm, Swish, FiLM attribute conditioning, optional
spectral norm or weight standardisation) and a SAGAN-style self-attention block.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn
from torch.nn.utils.parametrizations import spectral_norm as _spectral_norm

from composable_ebm.accel.labels import capturing, index_range
from composable_ebm.energy import Labels
from composable_ebm.errors import InvalidInputError
from composable_ebm.accel.derivatives import Conv2d, GroupNorm, silu

Norm = Literal["group", "instance", "none"]


class Swish(nn.Module):
    """``x * sigmoid(x)`` (Ramachandran et al. 2018), the paper's nonlinearity."""

    def forward(self, x: Tensor) -> Tensor:
        """``x * sigmoid(x)``."""
        return silu(x)


class WSConv2d(Conv2d):
    """Conv2d with weight standardisation (zero mean, unit variance per output filter)."""

    def filter(self) -> Tensor:
        """The weights standardised per output channel."""
        w = self.weight
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        std = w.std(dim=(1, 2, 3), keepdim=True, unbiased=False) + 1e-5
        return (w - mean) / std


def conv(cin: int, cout: int, kernel: int, spectral: bool, standardize: bool) -> nn.Module:
    """A same-padding conv, optionally spectrally normalised or weight-standardised."""
    if spectral and standardize:
        raise ValueError("choose at most one of spectral_norm and weight_standardization")
    cls = WSConv2d if standardize else Conv2d
    layer = cls(cin, cout, kernel, padding=kernel // 2)
    return _spectral_norm(layer) if spectral else layer


def norm_layer(kind: Norm, channels: int, groups: int) -> nn.Module:
    """Group norm (the paper's), instance norm (the authors' code up to 128 channels) or none."""
    if kind == "group":
        g = min(groups, channels)
        while channels % g:
            g -= 1
        return GroupNorm(g, channels)
    if kind == "instance":
        return GroupNorm(channels, channels)  # instance norm with affine, as one GroupNorm
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {kind!r}; valid choices: ['group', 'instance', 'none']")


class FiLM(nn.Module):
    """Feature-wise gain and bias from a condition vector: ``h * (1 + g(y)) + b(y)``.

    Zero-initialised, so a freshly built conditional network equals its unconditional one,
    and an all-zero condition (no attribute bound) leaves features unchanged.
    """

    def __init__(self, cond_dim: int, channels: int) -> None:
        super().__init__()
        self.map = nn.Linear(cond_dim, 2 * channels)
        nn.init.zeros_(self.map.weight)
        nn.init.zeros_(self.map.bias)

    def forward(self, h: Tensor, cond: Tensor) -> Tensor:
        """``h * (1 + g(y)) + b(y)`` for the condition vector ``cond``."""
        gain, bias = rearrange(self.map(cond), "b (two c) -> two b c 1 1", two=2)
        return h * (1 + gain) + bias


class ResBlock(nn.Module):
    """Two 3x3 convs, each followed by norm, FiLM and Swish; residual added; optional 2x average-pool down-sampling.

    A change of width goes through a 1x1 shortcut conv.
    """

    def __init__(
        self,
        cin: int,
        cout: int,
        down: bool,
        norm: Norm,
        groups: int,
        cond_dim: int,
        spectral: bool,
        standardize: bool,
    ) -> None:
        super().__init__()
        self.conv1 = conv(cin, cout, 3, spectral, standardize)
        self.norm1 = norm_layer(norm, cout, groups)
        self.conv2 = conv(cout, cout, 3, spectral, standardize)
        self.norm2 = norm_layer(norm, cout, groups)
        self.film1 = FiLM(cond_dim, cout) if cond_dim else None
        self.film2 = FiLM(cond_dim, cout) if cond_dim else None
        self.shortcut = conv(cin, cout, 1, spectral, False) if cin != cout else nn.Identity()
        self.act = Swish()
        self.down = down

    def forward(self, x: Tensor, cond: Tensor | None) -> Tensor:
        """Two norm-Swish-conv layers with FiLM conditioning, plus the shortcut; then optional 2x down-sampling."""
        h = self.norm1(self.conv1(x))
        if self.film1 is not None and cond is not None:
            h = self.film1(h, cond)
        h = self.act(h)
        h = self.norm2(self.conv2(h))
        if self.film2 is not None and cond is not None:
            h = self.film2(h, cond)
        h = self.act(h)
        out = h + self.shortcut(x)
        return F.avg_pool2d(out, 2) if self.down else out


class SelfAttention(nn.Module):
    """SAGAN self-attention (Zhang et al. 2019): query/key at C/8, output gain initialised to 0."""

    def __init__(self, channels: int, spectral: bool) -> None:
        super().__init__()
        inner = max(channels // 8, 1)
        self.query = conv(channels, inner, 1, spectral, False)
        self.key = conv(channels, inner, 1, spectral, False)
        self.value = conv(channels, channels, 1, spectral, False)
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor, cond: Tensor | None = None) -> Tensor:
        """Self-attention over spatial positions, added to the input."""
        h, w = x.shape[-2:]
        q = rearrange(self.query(x), "b c h w -> b (h w) c")
        k = rearrange(self.key(x), "b c h w -> b (h w) c")
        v = rearrange(self.value(x), "b c h w -> b (h w) c")
        # Plain ops rather than a fused attention kernel: the KL loss needs double backward.
        attn = torch.softmax(torch.einsum("bic,bjc->bij", q, k), dim=-1)  # (B, HW, HW), unscaled as in SAGAN
        out = torch.einsum("bij,bjc->bic", attn, v)  # (B, HW, C)
        return x + self.gamma * rearrange(out, "b (h w) c -> b c h w", h=h, w=w)


class LatentConfig:
    """What an image network over an autoencoder's latents reads from its config (``autoencoder`` and
    ``autoencoder_fingerprint``, checked by `configs.check_autoencoder`), mixed in before `Energy`."""

    @property
    def latent_source(self) -> str | None:
        """The autoencoder the config names (a bundled name, Hub id or folder), or None over pixels."""
        return self.config.autoencoder

    @property
    def latent_fingerprint(self) -> str | None:
        """The fingerprint of the autoencoder it was trained over, or None over pixels."""
        return self.config.autoencoder_fingerprint


class AttributeCodes:
    """What a conditional network's energy reads its condition from, for any network whose config has
    ``null_condition`` (mixed in before `Energy`): the attributes' one-hot codes, and whether the null condition
    was trained."""

    @property
    def has_null_condition(self) -> bool:
        """True for unconditional models and for conditional ones trained with label dropout."""
        return not self.attributes or self.config.null_condition

    def _no_null_condition(self, attr: str, values: tuple[str, ...]) -> str:
        """The error of an unbound attribute where the model has no null condition."""
        return (f"{self.name} was trained without a null condition (label dropout), so it has no unconditional energy;"
                f" bind its attribute: {self.name}[{attr}=...] with one of {list(values)}")

    def condition_vector(self, labels: Labels | None, batch: int, device: torch.device) -> Tensor | None:
        """Concatenated one-hot codes of the bound attributes; zeros (the null condition) for unbound
        ones and for items whose index is `NULL`. ``(B, D)``; ``None`` for an unconditional network.

        A model trained without label dropout (``config.null_condition`` false) never saw the null
        condition, so an unbound attribute is an error naming the attributes to bind.
        """
        if not self.attributes:
            return None
        parts = []
        for attr, values in self.attributes.items():
            idx = labels.get(attr) if labels is not None else None
            if not self.config.null_condition and (
                    idx is None or (idx.numel() > 0 and not capturing() and index_range(idx)[0] < 0)):
                raise InvalidInputError(self._no_null_condition(attr, values))
            if not self.config.null_condition and idx is not None and idx.numel() > 0 and torch.compiler.is_compiling():
                torch._assert_async((idx >= 0).all(), self._no_null_condition(attr, values))  # checked as it runs
            if idx is None:
                parts.append(torch.zeros(batch, len(values), device=device))
            else:
                parts.append(F.one_hot(idx.clamp(min=0), len(values)).float() * (idx >= 0).unsqueeze(1))
        return torch.cat(parts, dim=1)
