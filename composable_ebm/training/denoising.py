"""Denoising score matching for noise-conditioned energies (Vincent 2011; Song & Ermon 2019).

For data ``x``, a level ``sigma`` drawn log-uniformly from the model's ``noise_range`` and unit noise ``z``, the
noised point is ``x + sigma z`` and the loss is ``|sigma dE/dx(x + sigma z, sigma) - z|^2`` per pixel: the energy's
input gradient predicts the noise, so ``-dE/dx`` is the score of the noised data (the noise-prediction
weighting of Ho et al. 2020). The gradient is taken with ``create_graph``, so the loss reaches the parameters
through it. No chain runs: an iteration is one forward and two backward passes.

That weighting counts a level's error in the denoised image ``x - sigma^2 dE/dx`` by ``1 / sigma^2``: the high
levels, where the chains decide an image's layout and colours, count least. ``weighting="edm"`` multiplies each
level's loss by ``1 + sigma^2 / sigma_data^2``, which is the weighting of Karras et al. 2022 ("Elucidating the
Design Space of Diffusion-Based Generative Models", Eq. 8 with their ``lambda(sigma)``, written on the noise), divided
by its mean over the levels drawn, so the weights average 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from composable_ebm.energy import Energy, Labels, NoiseConditioned
from composable_ebm.errors import InvalidInputError
from composable_ebm.accel.derivatives import second_derivatives


@dataclass
class DenoisingOutput:
    """The loss of one iteration and its statistics."""

    loss: Tensor  # mean squared error of the predicted noise, per pixel
    energy: Tensor  # mean energy of the noised points (detached)


def noise_range(energy: Energy) -> tuple[float, float]:
    """The levels a noise-conditioned model trains on (`NoiseConditioned.noise_range`); one line when it has none."""
    found = energy.noise_range if isinstance(energy, NoiseConditioned) else None
    if not (isinstance(found, tuple) and len(found) == 2 and 0 < found[0] <= found[1]):
        raise InvalidInputError(f"{energy.name} depends on a noise level but states no noise_range (lowest, highest) to"
                                " train on; a noise-conditioned network must give one")
    return float(found[0]), float(found[1])


WEIGHTINGS = ("noise", "edm")


def edm_weights(sigma: Tensor, sigma_data: float, low: float, high: float) -> Tensor:
    """``1 + sigma^2 / sigma_data^2`` per level, over its mean for levels drawn log-uniformly from ``[low, high]``
    (``E[sigma^2] = (high^2 - low^2) / (2 log(high / low))``; ``high^2`` when they are one level)."""
    mean_square = (high * high - low * low) / (2 * math.log(high / low)) if high > low else high * high
    return (1 + sigma * sigma / sigma_data**2) / (1 + mean_square / sigma_data**2)


class DenoisingObjective(nn.Module):
    """The denoising score-matching loss of ``energy`` as a module (so DDP can wrap it), its levels weighted as
    ``weighting`` says (`WEIGHTINGS`; module docstring)."""

    def __init__(self, energy: Energy, weighting: str = "noise") -> None:
        super().__init__()
        self.energy = energy
        self.low, self.high = noise_range(energy)
        if weighting not in WEIGHTINGS:
            raise InvalidInputError(f"unknown loss weighting {weighting!r}; valid choices: {list(WEIGHTINGS)}")
        self.weighting = weighting
        self.sigma_data = energy.sigma_data if isinstance(energy, NoiseConditioned) else None
        if weighting == "edm" and not (isinstance(self.sigma_data, (int, float)) and self.sigma_data > 0):
            raise InvalidInputError(f"loss weighting 'edm' needs the data's standard deviation, and {energy.name}"
                                    " states no sigma_data; valid choices: 'noise', or a model with a sigma_data"
                                    " (the denoising-unet's [model] sigma_data)")

    def forward(self, x: Tensor, labels: Labels | None, generator: torch.Generator) -> DenoisingOutput:
        b = x.shape[0]
        u = torch.rand(b, generator=generator, device=x.device, dtype=x.dtype)
        sigma = torch.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
        z = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        noised = x + sigma.view((-1,) + (1,) * (x.ndim - 1)) * z
        weight = edm_weights(sigma, self.sigma_data, self.low, self.high) if self.weighting == "edm" else None
        loss, e = self.noise_prediction(noised, sigma, z, labels, weight)
        return DenoisingOutput(loss, e.detach().mean())

    def noise_prediction(self, noised: Tensor, sigma: Tensor, z: Tensor, labels: Labels | None,
                         weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The loss of predicting the noise ``z`` of ``noised`` (at levels ``sigma``, ``(B,)``) by ``sigma`` times
        the energy's input gradient, each item's error times ``weight`` (``(B,)``) when given, and the energies
        ``(B,)``."""
        noised = noised.detach().requires_grad_(True)
        with second_derivatives():  # the input gradient is differentiated again
            e = self.energy(noised, labels, sigma=sigma)
        (grad,) = torch.autograd.grad(e.sum(), noised, create_graph=True)
        return noise_prediction_loss(grad, sigma, z, weight), e


def noise_prediction_loss(grad: Tensor, sigma: Tensor, z: Tensor, weight: Tensor | None = None) -> Tensor:
    """The mean squared error, per pixel, of ``sigma`` (``(B,)``) times the energy's input gradient ``grad`` as a
    prediction of the noise ``z``; with ``weight`` (``(B,)``), each item's error times its weight."""
    shape = (-1,) + (1,) * (grad.ndim - 1)
    error = (sigma.view(shape) * grad - z).pow(2)
    return (error if weight is None else error * weight.view(shape)).mean()
