"""A small convolutional autoencoder, the shared latent space of latent energies.

In the style of TAESD (madebyollin/taesd): Conv-ReLU residual blocks, stride-2 stages, no attention and no
normalisation. The encoder maps ``(B, C, H, W)`` images in ``[0, 1]`` to ``(B, latent_channels, H / f, W / f)``
latents with ``f = 2 ** (len(widths) - 1)`` (f4 for three widths); the decoder maps them back. Latents are
standardised: `Autoencoder.encode` returns ``(encoder(x) - latent_shift) / latent_scale``, the two constants measured
on the training images after training and stored in the config, so a latent energy's noise levels mean the same for
every autoencoder.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from composable_ebm.configs import MAX_IMAGE_SIZE, MAX_WIDTH, JSONConfig, check_range, check_size
from composable_ebm.errors import InvalidInputError
from composable_ebm.model_types import register
from composable_ebm.pretrained import Pretrained


@dataclass(frozen=True)
class AutoencoderConfig(JSONConfig):
    """Configuration of an `Autoencoder` (round-trips through JSON)."""

    name: str = "autoencoder"
    image_size: int = 64
    """side of the square images it encodes"""
    in_channels: int = 3
    latent_channels: int = 4
    """channels of a latent"""
    widths: tuple[int, ...] = (32, 48, 64)
    """channels at each resolution, full first: each further width halves the side once (three widths: f4)"""
    blocks: int = 1
    """residual blocks at each resolution, in the encoder and in the decoder"""
    latent_shift: float = 0.0
    """the mean of the raw latents over the training images (subtracted by `Autoencoder.encode`)"""
    latent_scale: float = 1.0
    """their standard deviation (divided out by `Autoencoder.encode`)"""

    def __post_init__(self) -> None:
        owner = "AutoencoderConfig"
        check_size(owner, "image_size", self.image_size, low=8, high=MAX_IMAGE_SIZE)
        check_size(owner, "in_channels", self.in_channels, high=64)
        check_size(owner, "latent_channels", self.latent_channels, high=256)
        check_size(owner, "blocks", self.blocks, low=0, high=16)
        if not 1 <= len(self.widths) <= 5:
            raise InvalidInputError(f"{owner}.widths must list 1 to 5 widths (full resolution first), got"
                                    f" {list(self.widths)}")
        for width in self.widths:
            check_size(owner, "widths", width, high=MAX_WIDTH // 8)
        if self.image_size % self.factor:
            raise InvalidInputError(f"{owner}.image_size {self.image_size} must be a multiple of the downsampling"
                                    f" factor {self.factor} (2 ** (len(widths) - 1))")
        check_range(owner, "latent_shift", self.latent_shift, -1e6, 1e6)
        check_range(owner, "latent_scale", self.latent_scale, 0.0, 1e6, low_open=True)

    @property
    def factor(self) -> int:
        """How many times smaller a latent's side is than an image's."""
        return 2 ** (len(self.widths) - 1)

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """``(latent_channels, image_size / factor, image_size / factor)``."""
        side = self.image_size // self.factor
        return (self.latent_channels, side, side)


def _conv(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1)


class Block(nn.Module):
    """``relu(x + conv(relu(conv(relu(conv(x))))))``: TAESD's residual block."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(_conv(channels, channels), nn.ReLU(), _conv(channels, channels), nn.ReLU(),
                                  _conv(channels, channels))
        self.fuse = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.fuse(self.conv(x) + x)


@register("autoencoder")
class Autoencoder(Pretrained, nn.Module):
    """An image autoencoder with standardised latents (the module's docstring)."""

    config_class = AutoencoderConfig

    def __init__(self, config: AutoencoderConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or AutoencoderConfig()
        w = config.widths
        encoder: list[nn.Module] = [_conv(config.in_channels, w[0]), nn.ReLU()]
        encoder += [Block(w[0]) for _ in range(config.blocks)]
        for c_in, c_out in zip(w, w[1:]):  # each stage halves the side
            encoder += [_conv(c_in, c_out, stride=2), nn.ReLU(), *(Block(c_out) for _ in range(config.blocks))]
        encoder.append(_conv(w[-1], config.latent_channels))
        decoder: list[nn.Module] = [_conv(config.latent_channels, w[-1]), nn.ReLU()]
        for c_in, c_out in zip(w[::-1], w[-2::-1]):  # each stage doubles the side
            decoder += [*(Block(c_in) for _ in range(config.blocks)), nn.Upsample(scale_factor=2),
                        _conv(c_in, c_out), nn.ReLU()]
        decoder += [*(Block(w[0]) for _ in range(config.blocks)), _conv(w[0], config.in_channels)]
        self.encoder, self.decoder = nn.Sequential(*encoder), nn.Sequential(*decoder)

    @property
    def name(self) -> str:
        return self.config.name

    def _check(self, x: Tensor, shape: tuple[int, ...], what: str) -> None:
        if x.ndim != 4 or tuple(x.shape[1:]) != shape:
            raise InvalidInputError(f"{self.name} {what} a batch of shape (B, {', '.join(map(str, shape))}), got"
                                    f" {tuple(x.shape)}")

    def raw_latents(self, x: Tensor) -> Tensor:
        """The encoder's output, before standardisation: ``(B, latent_channels, H / f, W / f)``."""
        c = self.config
        self._check(x, (c.in_channels, c.image_size, c.image_size), "encodes")
        return self.encoder(x)

    def encode(self, x: Tensor) -> Tensor:
        """Standardised latents of images ``x`` in ``[0, 1]``, ``(B, *latent_shape)``."""
        return (self.raw_latents(x) - self.config.latent_shift) / self.config.latent_scale

    def decode(self, z: Tensor) -> Tensor:
        """Images of standardised latents ``z``, ``(B, in_channels, image_size, image_size)``, unclamped (training
        compares them with the images as they are; `reconstruct` and samplers clamp to ``[0, 1]``)."""
        self._check(z, self.config.latent_shape, "decodes")
        return self.decoder(z * self.config.latent_scale + self.config.latent_shift)

    def reconstruct(self, x: Tensor) -> Tensor:
        """``decode(encode(x))`` clamped to ``[0, 1]``."""
        return self.decode(self.encode(x)).clamp(0, 1)

    def forward(self, x: Tensor) -> Tensor:
        """The reconstruction before the clamp (what training compares with ``x``)."""
        return self.decode(self.encode(x))


def with_latent_statistics(model: Autoencoder, images: Tensor, batch: int = 256) -> Autoencoder:
    """``model`` with ``latent_shift`` and ``latent_scale`` measured on ``images`` (float in ``[0, 1]``): the mean and
    standard deviation of its raw latents over every element. The weights are shared, not copied."""
    import dataclasses

    with torch.no_grad():
        raw = torch.cat([model.raw_latents(images[i:i + batch]) for i in range(0, images.shape[0], batch)])
    config = dataclasses.replace(model.config, latent_shift=float(raw.mean()), latent_scale=float(raw.std()))
    model.config = config
    return model
