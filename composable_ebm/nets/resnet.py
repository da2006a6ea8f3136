"""ResNet energy networks from the paper's appendix tables (Du et al. 2021, Tables 6 and 7).

Each tower is: 3x3 stem conv, a sequence of residual blocks (some down-sampling) with a
self-attention block where the table puts it, Swish, global mean pooling, dense -> 1.

Multiscale (Section 3.4 "Compositional Multi-scale Generation"): the energy of an image is
the sum of three towers applied to the image at full, half and quarter resolution; the
half-resolution tower drops the first down-sampling block and the quarter-resolution tower
the first two ("Model Architectures" in the appendix). Towers share no weights.

Widths: a block changes width in its first conv (with a 1x1 shortcut), so dropping a
down-sampling block for the coarser towers never breaks the chain of widths.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composable_ebm.configs import (MAX_ACTIVATION_ELEMENTS, MAX_IMAGE_SIZE, JSONConfig, check_attributes,
                                    check_autoencoder, check_size)
from composable_ebm.energy import NULL, Energy, Labels
from composable_ebm.errors import InvalidInputError
from composable_ebm.nets.layers import AttributeCodes, LatentConfig, Norm, ResBlock, SelfAttention, Swish, conv
from composable_ebm.nets.transforms import apply, build_transforms
from composable_ebm.model_types import register
from composable_ebm.pretrained import Pretrained


@dataclass(frozen=True)
class BlockSpec:
    """One row of an architecture table."""

    kind: Literal["res", "attention"] = "res"
    channels: int = 64  # output width of a residual block (attention keeps its input width)
    down: bool = False  # 2x average-pool down-sampling after the block ("ResBlock Down")

    def __post_init__(self) -> None:
        if self.kind not in ("res", "attention"):
            raise InvalidInputError(f"unknown block kind {self.kind!r}; valid kinds: ['attention', 'res']")
        check_size("BlockSpec", "channels", self.channels)


def _table(*rows: str) -> tuple[BlockSpec, ...]:
    """Parse rows like ``"64"``, ``"64 down"``, ``"attention"`` into block specs."""
    specs = []
    for row in rows:
        if row == "attention":
            specs.append(BlockSpec(kind="attention"))
        else:
            width, *rest = row.split()
            specs.append(BlockSpec(channels=int(width), down=rest == ["down"]))
    return tuple(specs)


PAPER_32_BLOCKS = _table("64", "64 down", "64", "64 down", "attention", "128", "128 down", "256", "256 down")
"""Table "CIFAR-10 and ImageNet-32x32": the attention block follows the second down-sampling."""

PAPER_128_BLOCKS = _table("64 down", "128 down", "128 down", "256", "256 down", "attention", "512", "512 down")
"""Table "CelebA-HQ/LSUN"; the table labels the attention block 512 wide, but it follows a
256-wide block, so here it is 256 wide (attention keeps its input width)."""


@dataclass(frozen=True)
class ResNetConfig(JSONConfig):
    """Configuration of a `ResNetEnergy` (round-trips through JSON)."""

    name: str = "resnet"
    """The model's name (in expressions, cards and `print`)."""
    image_size: int = 32
    """Side of the square input images."""
    in_channels: int = 3
    """Image channels."""
    stem_channels: int = 64
    """Width of the 3x3 stem convolution."""
    blocks: tuple[BlockSpec, ...] = PAPER_32_BLOCKS
    """The architecture table: residual blocks (width, down-sampling) and attention blocks."""
    norm: Norm = "group"
    """group (paper) | instance (authors' code up to 128 channels) | none"""
    groups: int = 32
    """group-norm groups (reduced to a divisor of the width when needed)"""
    spectral_norm: bool = False
    """IGEBM's regulariser; the paper drops it"""
    weight_standardization: bool = False
    """the authors' code standardises conv weights"""
    multiscale: bool = True
    """sum of full, half and quarter resolution towers"""
    attributes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """name -> value names"""
    input_transforms: tuple[str, ...] = ()
    """named transforms (`composable_ebm.nets.transforms.TRANSFORMS`) applied, in order, to what the towers see;
    the pixel-set head sees the image as it is. A dataset registers those it needs beside its own code, and the
    registry lists them all"""
    condition_head: Literal["film", "pixel_set", "projection"] = "film"
    """where the condition enters: `film` modulates every residual block (or the last `film_blocks`);
    `projection` leaves the blocks unconditional and adds ``-<V c, h>`` to each tower's energy, ``h`` its pooled
    features (the projection discriminator's form, Miyato & Koyama 2018), so a guided term costs one pass of the
    blocks; `pixel_set` leaves the towers
    unconditional and adds ``-logit_c(x)`` from a head that sees the image as a set of pixels (a 1x1-conv
    feature of each pixel, pooled over the image: `pixel_pool`), so the condition can depend on the image's colours but
    not on where they are: a colour model that cannot prefer one shape over another for a colour"""
    pixel_pool: Literal["mean", "attention"] = "mean"
    """how the pixel-set head pools its pixels: `mean` averages every pixel, so its logit grows with the area of
    a colour; `attention` averages them with softmax weights from a learned per-pixel score, so a small object of
    a colour reads as that colour as much as a large one"""
    film_blocks: int = 0
    """with ``condition_head = "film"``: 0 modulates every residual block; N > 0 only the last N of each tower, so
    the condition enters late and a guided term (``E(x | c)`` and ``E(x | 0)`` together) runs the layers before
    them once, on a batch of B instead of 2B"""
    null_condition: bool = False
    """the all-zero condition was trained (label dropout), so an unbound attribute gives the model's
    unconditional energy; without it an unbound attribute is refused"""
    autoencoder: str | None = None
    """the autoencoder whose standardised latents this energy is over (a bundled name, a Hub id, or a folder relative
    to the model's; `composable_ebm.latent`): its input is then unbounded, and ``image_size`` and ``in_channels`` are
    the latents'. None: an energy over pixels in ``[0, 1]``"""
    autoencoder_fingerprint: str | None = None
    """`composable_ebm.latent.fingerprint` of the autoencoder it was trained over: loading it with another autoencoder
    under that name (a retrained one, say) is refused, as its latents would mean something else"""

    def __post_init__(self) -> None:
        check_autoencoder("ResNetConfig", self.autoencoder)
        check_size("ResNetConfig", "image_size", self.image_size, high=MAX_IMAGE_SIZE)
        check_size("ResNetConfig", "in_channels", self.in_channels, high=64)
        check_size("ResNetConfig", "stem_channels", self.stem_channels)
        check_size("ResNetConfig", "groups", self.groups)
        if len(self.blocks) > 256:
            raise InvalidInputError(f"ResNetConfig.blocks holds {len(self.blocks)} blocks; at most 256")
        if self.condition_head not in ("film", "pixel_set", "projection"):
            raise InvalidInputError(
                f"unknown condition_head {self.condition_head!r}; valid choices: ['film', 'pixel_set', 'projection']")
        if self.pixel_pool not in ("mean", "attention"):
            raise InvalidInputError(f"unknown pixel_pool {self.pixel_pool!r}; valid choices: ['attention', 'mean']")
        n_res = sum(1 for b in self.blocks if b.kind == "res")
        if not isinstance(self.film_blocks, int) or isinstance(self.film_blocks, bool) or not 0 <= self.film_blocks <= n_res:
            raise InvalidInputError(
                f"ResNetConfig.film_blocks must be an integer from 0 (every residual block) to the number of residual"
                f" blocks ({n_res}); got {self.film_blocks!r}")
        if self.norm not in ("group", "instance", "none"):
            raise InvalidInputError(f"unknown norm {self.norm!r}; valid choices: ['group', 'instance', 'none']")
        check_attributes("ResNetConfig", self.attributes)
        if isinstance(self.input_transforms, str) or not all(isinstance(t, str) for t in self.input_transforms):
            raise InvalidInputError(f"ResNetConfig.input_transforms must be a list of transform names, got"
                                    f" {self.input_transforms!r}")
        object.__setattr__(self, "input_transforms", tuple(self.input_transforms))
        needed = self.activation_elements()
        if needed > MAX_ACTIVATION_ELEMENTS:
            raise InvalidInputError(
                f"ResNetConfig: image_size {self.image_size} with stem_channels {self.stem_channels} and these blocks"
                f" needs {needed:,} activation elements per image; at most {MAX_ACTIVATION_ELEMENTS:,} (1 GiB in"
                " float32): lower image_size or the channels")

    def activation_elements(self) -> int:
        """An upper estimate of the activation elements one image needs in a forward pass, every tower:
        the stem's output, each residual block's two convolutions at its resolution, and each attention
        block's (pixels x pixels) map and its input."""
        total = 0
        for i, scale in enumerate(self.scales):
            side = max(1, self.image_size // scale)
            width = self.stem_channels
            total += side * side * width
            for block in tower_blocks(self.blocks, drop_downs=i):
                if block.kind == "attention":
                    total += (side * side) ** 2 + 3 * side * side * width
                    continue
                width = block.channels
                total += 2 * side * side * width
                if block.down:
                    side = max(1, side // 2)
        return total

    @classmethod
    def paper_32(cls, **overrides) -> ResNetConfig:
        """The 32x32 network (CIFAR-10, ImageNet 32x32): multiscale with self-attention."""
        return dataclasses.replace(cls(name="paper-32", image_size=32, blocks=PAPER_32_BLOCKS), **overrides)

    @classmethod
    def paper_128(cls, **overrides) -> ResNetConfig:
        """The 128x128 network (CelebA-HQ, LSUN bedroom)."""
        return dataclasses.replace(cls(name="paper-128", image_size=128, blocks=PAPER_128_BLOCKS), **overrides)

    @property
    def scales(self) -> tuple[int, ...]:
        """Down-scaling factor of each tower's input."""
        return (1, 2, 4) if self.multiscale else (1,)


def tower_blocks(blocks: Sequence[BlockSpec], drop_downs: int) -> list[BlockSpec]:
    """The table with its first ``drop_downs`` down-sampling residual blocks removed."""
    out, dropped = [], 0
    for b in blocks:
        if b.kind == "res" and b.down and dropped < drop_downs:
            dropped += 1
            continue
        out.append(b)
    if dropped < drop_downs:
        raise ValueError(f"multiscale needs at least {drop_downs} down-sampling blocks, the table has {dropped}")
    return out


class ResNetTower(nn.Module):
    """One tower: stem, blocks, Swish, global mean pool, dense -> 1. Returns ``(B,)``."""

    def __init__(self, config: ResNetConfig, blocks: Sequence[BlockSpec], cond_dim: int) -> None:
        super().__init__()
        c = config
        self.stem = conv(c.in_channels, c.stem_channels, 3, c.spectral_norm, False)
        layers: list[nn.Module] = []
        width = c.stem_channels
        n_res = sum(1 for b in blocks if b.kind == "res")
        project = c.condition_head == "projection" and cond_dim > 0
        film_dim = 0 if project else cond_dim
        first_film = n_res - c.film_blocks if c.film_blocks else 0  # index (among residual blocks) of the first with FiLM
        self.shared = len(blocks)  # blocks before the first conditioned one: the same for every condition
        seen = 0
        for i, b in enumerate(blocks):
            if b.kind == "attention":
                layers.append(SelfAttention(width, c.spectral_norm))
            elif b.kind == "res":
                film = film_dim if seen >= first_film else 0
                if film and self.shared == len(blocks):
                    self.shared = i
                layers.append(
                    ResBlock(
                        width, b.channels, b.down, c.norm, c.groups, film, c.spectral_norm,
                        c.weight_standardization,
                    )
                )
                width = b.channels
                seen += 1
            else:
                raise ValueError(f"unknown block kind {b.kind!r}; valid kinds: ['res', 'attention']")
        self.blocks = nn.ModuleList(layers)
        self.act = Swish()
        self.head = nn.Linear(width, 1)
        self.project = nn.Linear(cond_dim, width, bias=False) if project else None
        if c.spectral_norm:
            self.head = nn.utils.parametrizations.spectral_norm(self.head)
        self.num_downs = sum(1 for b in blocks if b.kind == "res" and b.down)

    def forward(self, x: Tensor, cond: Tensor | None) -> Tensor:
        """The tower's scalar energy of ``x`` under the condition vector ``cond``, ``(B,)``."""
        return self.finish(self.start(x), cond)

    def start(self, x: Tensor) -> Tensor:
        """The stem and the blocks before the first conditioned one (their output does not depend on the condition)."""
        h = self.stem(x)
        for block in self.blocks[: self.shared]:
            h = block(h, None)
        return h

    def finish(self, h: Tensor, cond: Tensor | None) -> Tensor:
        """The remaining blocks under ``cond``, pooling and the dense layer: ``(B,)``."""
        for block in self.blocks[self.shared:]:
            h = block(h, cond)
        h = self.act(h).mean(dim=(2, 3))  # global mean pooling, (B, C)
        out = self.head(h).squeeze(-1)
        if self.project is not None and cond is not None:
            out = out - (self.project(cond) * h).sum(dim=1)
        return out


class PixelSetHead(nn.Module):
    """Logits ``(B, D)`` of the condition's values from the image seen as a set of pixels: two 1x1
    convolutions with Swish, pooled over the image (a plain mean, or softmax attention over the pixels),
    then a dense layer. Blind to where a colour is."""

    def __init__(self, in_channels: int, width: int, cond_dim: int, pool: str = "mean") -> None:
        super().__init__()
        self.pixel = nn.Sequential(nn.Conv2d(in_channels, width, 1), Swish(), nn.Conv2d(width, width, 1), Swish())
        self.score = nn.Conv2d(width, 1, 1) if pool != "mean" else None
        self.out = nn.Linear(width, cond_dim)

    def forward(self, x: Tensor) -> Tensor:
        h = self.pixel(x)  # (B, W, H, W')
        if self.score is None:
            return self.out(h.mean(dim=(2, 3)))
        scores = self.score(h)  # (B, 1, H, W'): where the head looks
        weights = scores.flatten(1).softmax(dim=1)  # (B, H*W')
        return self.out(torch.einsum("bp,bwp->bw", weights, h.flatten(2)))


@register("resnet")
class ResNetEnergy(Pretrained, AttributeCodes, LatentConfig, Energy):
    """The paper's ResNet energy, optionally multiscale and attribute-conditioned (FiLM, a projection or a pixel-set
    head), with optional named input transforms before its towers."""

    config_class = ResNetConfig
    presets = {"paper_32": ResNetConfig.paper_32, "paper_128": ResNetConfig.paper_128}

    def __init__(self, config: ResNetConfig) -> None:
        c = config
        super().__init__((c.in_channels, c.image_size, c.image_size), None if c.autoencoder else (0.0, 1.0),
                         c.attributes)
        self.config = config
        cond_dim = sum(len(v) for v in c.attributes.values())
        towers = []
        for i, scale in enumerate(c.scales):
            blocks = tower_blocks(c.blocks, drop_downs=i)
            size = c.image_size // scale
            downs = sum(1 for b in blocks if b.kind == "res" and b.down)
            if c.image_size % scale or size % (2**downs):
                raise ValueError(
                    f"image_size {c.image_size} does not fit the table: the 1/{scale} tower sees {size}x{size}"
                    f" and down-samples {downs} times"
                )
            towers.append(ResNetTower(c, blocks, cond_dim if c.condition_head in ("film", "projection") else 0))
        self.towers = nn.ModuleList(towers)
        self.transforms = build_transforms(c.input_transforms)
        self.head = PixelSetHead(c.in_channels, c.stem_channels, cond_dim, c.pixel_pool) if (
            c.condition_head == "pixel_set" and cond_dim) else None

    @property
    def name(self) -> str:
        return self.config.name

    def scale_energies(self, x: Tensor, labels: Labels | None = None) -> Tensor:
        """Energy of each tower, ``(B, num_scales)``; the energy is their sum."""
        if labels:
            labels = self.encode_labels(labels, x.shape[0], x.device)
        return self._tower_energies(x, labels or None)

    def _tower_inputs(self, x: Tensor) -> list[Tensor]:
        """What each tower sees: ``x`` through the config's input transforms, pooled to its scale."""
        x = apply(self.transforms, x)
        return [F.avg_pool2d(x, scale) if scale > 1 else x for scale in self.config.scales]

    def _tower_energies(self, x: Tensor, labels: Labels | None) -> Tensor:
        cond = self.condition_vector(labels or None, x.shape[0], x.device)
        if cond is not None:
            cond = cond.to(x.dtype)
        outs = [tower(xs, cond if self.head is None else None)
                for xs, tower in zip(self._tower_inputs(x), self.towers, strict=True)]
        if self.head is not None and labels:  # the condition's term joins the first tower's energy (none when unbound)
            outs[0] = outs[0] + self._head_energy(x, cond)
        return torch.stack(outs, dim=1)

    def energy(self, x: Tensor, labels: Labels | None) -> Tensor:
        """Sum of the towers' energies (full, half and quarter resolution when multiscale), ``(B,)``."""
        return self._tower_energies(x, labels).sum(dim=1)

    def conditioned_and_null(self, x: Tensor, labels: dict[str, Tensor],
                             sigma: Tensor | float | None = None) -> tuple[Tensor, Tensor]:
        """The energy does not depend on the noise level ``sigma``. With the pixel-set head the towers are unconditional: run them once, ``E(x | c) = E(x | 0) - logit_c``.
        With late FiLM (``film_blocks``) or the projection head each tower runs the blocks before its condition once
        and only the rest (for the projection: pooling and the dense layers) on both halves."""
        if self.head is None and (self.config.film_blocks or self.config.condition_head == "projection"):
            self._check_batch(x)
            b = x.shape[0]
            codes = self.encode_labels(labels, b, x.device)
            cond = self.condition_vector(codes, b, x.device)
            null = self.condition_vector({a: torch.full_like(i, NULL) for a, i in codes.items()}, b, x.device)
            both = torch.cat([cond, null]).to(x.dtype)
            total = 0
            for xs, tower in zip(self._tower_inputs(x), self.towers, strict=True):
                h = tower.start(xs)
                total = total + tower.finish(torch.cat([h, h]), both)
            return total[:b], total[b:]
        if self.head is None:
            return super().conditioned_and_null(x, labels, sigma)
        null = self(x)  # the towers' energy alone: unbound, the head is not run
        cond = self.condition_vector(self.encode_labels(labels, x.shape[0], x.device), x.shape[0], x.device)
        return null + self._head_energy(x, cond.to(x.dtype)), null

    def _head_energy(self, x: Tensor, cond: Tensor) -> Tensor:
        """The pixel-set head's term for the condition codes ``cond`` ``(B, D)``: ``-logit_c``, 0 for unbound
        attributes. ``(B,)``."""
        return -(self.head(x) * cond).sum(dim=1)

    def extra_repr(self) -> str:
        """The config's name, image size and attributes, for ``print(model)``."""
        return f"name={self.config.name!r}, input_shape={self.input_shape}, multiscale={self.config.multiscale}"
