"""Noise-conditioned energies: a U-Net whose squared output is an energy at every noise level.

The energy of an image ``x`` at noise level ``sigma`` (the std of Gaussian noise added to the data) is

    E(x, sigma) = ||f(x, sigma, y)||^2 / (2 sigma)

with ``f`` a U-Net of the image's shape. This is the squared-norm form of Du et al. 2023 ("Reduce, Reuse,
Recycle", Sec. 3; their code's energy is ``0.5 * out ** 2`` summed, whose input gradient is the predicted
noise). We use it rather than the inner-product form because it is bounded below (``E >= 0``), so a sum,
a weighted negation and a disjunction of such energies stay well defined for the Metropolis-Hastings
corrections of the annealed samplers. Dividing by ``sigma`` makes ``-dE/dx`` the score of the noised data
when ``d/dx ||f||^2 / 2`` predicts the unit noise (denoising score matching, Vincent 2011;
`composable_ebm.training.denoising`).

The U-Net sees the image through the EDM preconditioning (Karras et al. 2022): ``c_in (x - 1/2)`` (``c_in x`` for
standardised latents, `DenoisingUNetConfig.autoencoder`) with
``c_in = 1 / sqrt(sigma^2 + sigma_data^2)``, and the level as ``log(sigma) / 4``, which enters every residual
block by FiLM together with the condition's one-hot code (zeros for an unbound attribute: the null condition
that label dropout trains). ``f`` is divided by ``sqrt(c_in)`` so that ``d/dx ||f||^2 / 2`` is the U-Net's own
Jacobian-vector product, of the noise's scale at every level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composable_ebm.configs import (MAX_IMAGE_SIZE, JSONConfig, check_attributes, check_autoencoder, check_range,
                                    check_size)
from composable_ebm.energy import Labels, NoiseConditioned, noise_levels
from composable_ebm.errors import InvalidInputError
from composable_ebm.accel.derivatives import GroupNorm, silu
from composable_ebm.nets.layers import AttributeCodes, LatentConfig, ResBlock, Swish, conv
from composable_ebm.nets.transforms import apply, build_transforms
from composable_ebm.model_types import register
from composable_ebm.pretrained import Pretrained


@dataclass(frozen=True)
class DenoisingUNetConfig(JSONConfig):
    """Configuration of a `DenoisingUNetEnergy` (round-trips through JSON)."""

    name: str = "denoising-unet"
    """The model's name (in expressions, cards and `print`)."""
    image_size: int = 16
    """Side of the square input images (a multiple of ``2 ** (len(channels) - 1)``)."""
    in_channels: int = 3
    """Image channels."""
    channels: tuple[int, ...] = (32, 64, 64)
    """Width at each resolution, from the full one down; each step down halves the side."""
    blocks: int = 1
    """Residual blocks per resolution on the way down (the way up has one more, as the skip connections need)."""
    embedding: int = 64
    """Width of the noise level's and the condition's embedding, which FiLM reads in every block."""
    groups: int = 8
    """Group-norm groups (reduced to a divisor of the width when needed)."""
    sigma_min: float = 0.01
    """Lowest noise level trained; the energy without a level is the energy at this one."""
    sigma_max: float = 1.0
    """Highest noise level trained (in units of the [0, 1] pixel range)."""
    sigma_data: float = 0.3
    """The data's standard deviation per pixel, for the preconditioning."""
    attributes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """name -> value names"""
    input_transforms: tuple[str, ...] = ()
    """named transforms (`composable_ebm.nets.transforms.TRANSFORMS`) applied, in order, to the image before the
    U-Net, so the energy is invariant to what they remove (``channel-sort``: the order of the colour channels)"""
    null_condition: bool = False
    """the all-zero condition was trained (label dropout), so an unbound attribute gives the model's
    unconditional energy; without it an unbound attribute is refused"""
    autoencoder: str | None = None
    """the autoencoder whose standardised latents this energy is over (a bundled name, a Hub id, or a folder relative
    to the model's; `composable_ebm.latent`): its input is then unbounded and centred on 0, and ``image_size`` and
    ``in_channels`` are the latents'. None: an energy over pixels in ``[0, 1]``"""
    autoencoder_fingerprint: str | None = None
    """`composable_ebm.latent.fingerprint` of the autoencoder it was trained over: loading it with another autoencoder
    under that name (a retrained one, say) is refused, as its latents would mean something else"""

    def __post_init__(self) -> None:
        check_autoencoder("DenoisingUNetConfig", self.autoencoder)
        check_size("DenoisingUNetConfig", "image_size", self.image_size, high=MAX_IMAGE_SIZE)
        check_size("DenoisingUNetConfig", "in_channels", self.in_channels, high=64)
        check_size("DenoisingUNetConfig", "blocks", self.blocks, high=16)
        check_size("DenoisingUNetConfig", "embedding", self.embedding, high=4096)
        check_size("DenoisingUNetConfig", "groups", self.groups)
        if isinstance(self.channels, (str, int)) or not 1 <= len(self.channels) <= 8:
            raise InvalidInputError(f"DenoisingUNetConfig.channels must list 1 to 8 widths, got {self.channels!r}")
        for width in self.channels:
            check_size("DenoisingUNetConfig", "channels[i]", width, high=2048)
        object.__setattr__(self, "channels", tuple(self.channels))
        if self.image_size % 2 ** (len(self.channels) - 1):
            raise InvalidInputError(
                f"DenoisingUNetConfig.image_size {self.image_size} must be a multiple of 2^{len(self.channels) - 1}"
                f" for {len(self.channels)} resolutions; valid choices: fewer channels entries or another size")
        check_range("DenoisingUNetConfig", "sigma_min", self.sigma_min, 0.0, low_open=True)
        check_range("DenoisingUNetConfig", "sigma_max", self.sigma_max, self.sigma_min, 1e4, low_open=True)
        check_range("DenoisingUNetConfig", "sigma_data", self.sigma_data, 0.0, 1e4, low_open=True)
        check_attributes("DenoisingUNetConfig", self.attributes)
        if isinstance(self.input_transforms, str) or not all(isinstance(t, str) for t in self.input_transforms):
            raise InvalidInputError(f"DenoisingUNetConfig.input_transforms must be a list of transform names, got"
                                    f" {self.input_transforms!r}")
        object.__setattr__(self, "input_transforms", tuple(self.input_transforms))


def level_features(sigma: Tensor, width: int) -> Tensor:
    """Sinusoidal features ``(B, width)`` of ``log(sigma) / 4`` (the EDM noise input), as a transformer's positions."""
    half = width // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=sigma.device, dtype=sigma.dtype) / max(half, 1))
    angle = (sigma.log() / 4.0 * 1000.0).unsqueeze(1) * freqs.unsqueeze(0)
    feats = torch.cat([angle.sin(), angle.cos()], dim=1)
    return F.pad(feats, (0, width - feats.shape[1]))


@register("denoising-unet")
class DenoisingUNetEnergy(Pretrained, AttributeCodes, LatentConfig, NoiseConditioned):
    """``E(x, sigma | y) = ||f(x, sigma, y)||^2 / (2 sigma)``, a U-Net ``f``: see the module's docstring."""

    config_class = DenoisingUNetConfig
    condition_weights = ("embed_condition.",)  # added to the level's embedding: zero is the null condition

    def __init__(self, config: DenoisingUNetConfig) -> None:
        c = config
        latent = c.autoencoder is not None
        super().__init__((c.in_channels, c.image_size, c.image_size), None if latent else (0.0, 1.0), c.attributes)
        self.centre = 0.0 if latent else 0.5
        """the middle of the data the preconditioning subtracts: standardised latents' 0, pixels' 1/2"""
        self.config = config
        cond_dim = sum(len(v) for v in c.attributes.values())
        self.embed_level = nn.Sequential(nn.Linear(c.embedding, c.embedding), Swish(), nn.Linear(c.embedding, c.embedding))
        self.embed_condition = nn.Linear(cond_dim, c.embedding, bias=False) if cond_dim else None
        self.stem = conv(c.in_channels, c.channels[0], 3, False, False)

        def block(cin: int, cout: int) -> ResBlock:
            return ResBlock(cin, cout, False, "group", c.groups, c.embedding, False, False)

        self.down = nn.ModuleList()
        skips, width = [c.channels[0]], c.channels[0]
        for level, out in enumerate(c.channels):
            for _ in range(c.blocks):
                self.down.append(block(width, out))
                width = out
                skips.append(width)
            if level < len(c.channels) - 1:
                self.down.append(nn.AvgPool2d(2))
                skips.append(width)
        self.middle = block(width, width)
        self.up = nn.ModuleList()
        for level, out in reversed(list(enumerate(c.channels))):
            for _ in range(c.blocks + 1):
                self.up.append(block(width + skips.pop(), out))
                width = out
            if level > 0:
                self.up.append(nn.Upsample(scale_factor=2, mode="nearest"))
        self.out_norm = GroupNorm(math.gcd(c.groups, width), width)
        self.out = conv(width, c.in_channels, 3, False, False)
        self.transforms = build_transforms(c.input_transforms)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def noise_range(self) -> tuple[float, float]:
        """The lowest and highest noise levels it is trained on."""
        return self.config.sigma_min, self.config.sigma_max

    @property
    def sigma_data(self) -> float:
        """The data's standard deviation its preconditioning assumes (``DenoisingUNetConfig.sigma_data``)."""
        return self.config.sigma_data

    def residual(self, x: Tensor, sigma: Tensor, labels: Labels | None) -> Tensor:
        """``f(x, sigma, y)``, the shape of ``x``: the energy is half its squared norm over ``sigma``."""
        c = self.config
        c_in = (sigma * sigma + c.sigma_data**2).rsqrt().view(-1, 1, 1, 1)
        emb = self.embed_level(level_features(sigma, c.embedding))
        cond = self.condition_vector(labels, x.shape[0], x.device)
        if cond is not None:
            emb = emb + self.embed_condition(cond.to(emb.dtype))
        h = self.stem(c_in * (apply(self.transforms, x) - self.centre))
        skips = [h]
        for layer in self.down:
            h = layer(h) if isinstance(layer, nn.AvgPool2d) else layer(h, emb)
            skips.append(h)
        h = self.middle(h, emb)
        for layer in self.up:
            h = layer(h) if isinstance(layer, nn.Upsample) else layer(torch.cat([h, skips.pop()], dim=1), emb)
        return self.out(silu(self.out_norm(h))) * c_in.rsqrt()

    def energy(self, x: Tensor, labels: Labels | None, sigma: Tensor | None = None) -> Tensor:
        """``||f||^2 / (2 sigma)``, ``(B,)``; without a level, at ``sigma_min``."""
        if sigma is None:
            sigma = noise_levels(self.config.sigma_min, x.shape[0], x.device, x.dtype)
        f = self.residual(x, sigma.to(x.dtype), labels)
        return 0.5 * f.flatten(1).pow(2).sum(dim=1) / sigma.to(f.dtype)

    def extra_repr(self) -> str:
        """The config's name, image size and noise range, for ``print(model)``."""
        c = self.config
        return f"name={c.name!r}, input_shape={self.input_shape}, sigma=[{c.sigma_min:g}, {c.sigma_max:g}]"
