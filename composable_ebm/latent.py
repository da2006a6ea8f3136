"""Latent energies: energies over the latents of one shared autoencoder.

A latent energy is an ordinary energy whose input is ``(latent_channels, H / f, W / f)``; its model folder names its
autoencoder (``"autoencoder": "faces64-autoencoder"`` in its config: a bundled name, a Hub id, or a folder, relative
to the model's own when it is one). Loading the model loads that autoencoder too and gives the energy a
`LatentSpace` (``energy.latent_space``; None for an energy over pixels). The algebra composes energies over the same
latent space (the same weights, however each model named them) in that space; a composite of two latent spaces, or
of latents and pixels, is one line naming both. The pipeline samples latents and decodes them once, after the chain
(`composable_ebm.pipeline.run`), so ``.sample`` returns images.

What a latent space changes in the algebra: a density over latents ``p(z)`` is a density over images only up to the
decoder's Jacobian, ``p(x) = p(z) / |det J(z)|``. A guided sum ``E_0 + sum_i s_i (E_i(z | c_i) - E_i(z | 0))`` holds
one density (``E_0``) and differences of densities over the same ``z``, so the Jacobian cancels in every difference
and appears once, as in a single model: guidance needs no correction. A plain sum of ``K`` latent energies is the
product of ``K`` latent densities, each an image density times ``|det J|``: its energy is that of the product of the
image densities minus ``(K - 1) log |det J|``, which favours latents where the decoder expands (``docs/latent.md``
measures it).
"""

from __future__ import annotations

import hashlib
import json

import torch
from torch import Tensor, nn

from composable_ebm.errors import NonFiniteError
from composable_ebm.images import as_float_images

DECODE_BATCH = 64
"""Latents decoded at a time (bounds the decoder's activations at 64 px and beyond)."""


class LatentSpace:
    """The latents of one autoencoder, as latent energies share them: what ``energy.latent_space`` holds.

    Two latent spaces are the same when their autoencoders' weights and constants are (``fingerprint``), whatever name
    each model gave it. It is not a module of the energy: moving or saving an energy leaves the autoencoder alone,
    and `decode` moves it to the latents' device.
    """

    def __init__(self, autoencoder: nn.Module, source: str) -> None:
        """``autoencoder``: a `composable_ebm.nets.autoencoder.Autoencoder` (this layer imports no network)."""
        self.autoencoder = autoencoder.eval().requires_grad_(False)
        self.source = source
        """the autoencoder as the model names it (a bundled name, a Hub id or a folder)"""
        self.fingerprint = fingerprint(autoencoder)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LatentSpace) and other.fingerprint == self.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __str__(self) -> str:
        return self.source

    def __repr__(self) -> str:
        return f"LatentSpace({self.source!r}, {self.fingerprint[:12]})"

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """The shape of one decoded image, ``(C, H, W)``."""
        c = self.autoencoder.config
        return (c.in_channels, c.image_size, c.image_size)

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """The shape of one latent, ``(latent_channels, H / f, W / f)``."""
        return self.autoencoder.config.latent_shape

    @torch.no_grad()
    def encode(self, images: Tensor, batch: int = 256) -> Tensor:
        """Standardised latents of images ``(N, C, H, W)`` (float in ``[0, 1]``, or uint8), float32, on the host."""
        model = self.autoencoder.to(images.device)
        out = [model.encode(as_float_images(images[i:i + batch])).float().cpu() for i in range(0, images.shape[0], batch)]
        return torch.cat(out) if out else torch.empty(0, *self.latent_shape)

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Images in ``[0, 1]`` of latents ``(N, *latent_shape)``, on the latents' device; a decode that gives a
        non-finite pixel is one line (`NonFiniteError`), as a sampler's non-finite state is."""
        model = self.autoencoder.to(latents.device)
        parts = [model.decode(latents[i:i + DECODE_BATCH].float()) for i in range(0, latents.shape[0], DECODE_BATCH)]
        images = torch.cat(parts) if parts else latents.new_empty(0, *self.image_shape)
        bad = ~torch.isfinite(images).flatten(1).all(dim=1)
        if bool(bad.any()):
            raw = ~torch.isfinite(latents).flatten(1).all(dim=1)
            why = "non-finite latents" if bool(raw[bad].any()) else "latents far outside what it was trained on"
            raise NonFiniteError(f"decoding {int(bad.sum())} of {latents.shape[0]} sampled latents with {self.source}"
                                 f" gave non-finite pixels ({why}); lower the step size or the guidance weights")
        return images.clamp(0, 1)


def fingerprint(autoencoder: nn.Module) -> str:
    """A sha256 over the autoencoder's config (its name left out) and weights: equal for the same autoencoder however
    it was named or saved."""
    settings = {k: v for k, v in autoencoder.config.to_dict().items() if k != "name"}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8"))
    for name, tensor in autoencoder.state_dict().items():
        digest.update(name.encode("utf-8"))
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()

