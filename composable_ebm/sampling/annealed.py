"""Annealed sampling of noise-conditioned energies: any registered transition, level by level down a noise ladder.

Between levels the chain takes the reverse-diffusion step: from level ``s`` to ``s'`` it moves to a draw of the
noised image at ``s'`` given the one at ``s`` and the denoised estimate ``x - s^2 dE/dx`` (the Gaussian posterior
of a variance-exploding diffusion), ``x - (s^2 - s'^2) dE/dx + (s' / s) sqrt(s^2 - s'^2) z``. At level ``sigma``
the chain runs the transition (`langevin`, `mala`, `hmc`, ...) on ``E(., sigma)`` with step size
``step_size * sigma^2`` and exact Langevin noise, so MALA and HMC correct every level with a per-chain
Metropolis-Hastings step on the sum's own energy (Du et al. 2023, "Reduce, Reuse, Recycle": an energy, unlike a
summed score, makes that correction possible). The positions are not clamped on the way down (noised data leaves
the pixel range); the last one is denoised (`NoiseLadder.denoise`) and clamped to the value range.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from composable_ebm.errors import InvalidInputError
from composable_ebm.sampling.graphs import transitions
from composable_ebm.sampling.transitions import SAMPLERS, ChainState, SamplerConfig, StepInfo, evaluate

if TYPE_CHECKING:  # pragma: no cover; the sampler runs any energy it is handed and imports none
    from composable_ebm.energy import Energy, Labels


class AtLevel:
    """``energy`` seen at one noise level: what a transition needs of an energy (its energies and input gradient,
    no value range: noised positions are not clamped). Not itself an `Energy`: it only exists inside a chain."""

    value_range = None

    def __init__(self, energy: Energy, sigma: float) -> None:
        self.base, self.sigma = energy, float(sigma)
        self.input_shape = energy.input_shape

    def energy_and_grad(self, x: Tensor, labels: Labels | None = None, create_graph: bool = False,
                        ) -> tuple[Tensor, Tensor]:
        return self.base.energy_and_grad(x, labels, create_graph=create_graph, sigma=self.sigma)

    def expression(self) -> str:
        return f"{self.base.expression()} at sigma={self.sigma:g}"

    def graph_identity(self) -> tuple[Energy, float]:
        """What a CUDA graph of a transition on this view is kept with and told apart by
        (`composable_ebm.sampling.graphs`): the energy underneath, and the level."""
        return self.base, self.sigma


def ladder_start(energy: Energy, n: int, config: SamplerConfig, generator: torch.Generator,
                 device: torch.device) -> Tensor:
    """Chain starts for a ladder: the value range's centre (0 when unbounded) plus noise of std ``sigma_max``."""
    if config.ladder is None:
        raise ValueError("ladder_start needs a SamplerConfig with a ladder")
    centre = 0.0 if energy.value_range is None else sum(energy.value_range) / 2
    return centre + config.ladder.sigma_max * torch.randn((n, *energy.input_shape), generator=generator, device=device)


def run_ladder(
    energy: Energy,
    x: Tensor,
    config: SamplerConfig,
    generator: torch.Generator,
    labels: Labels | None = None,
    *,
    on_step: Callable[[int, ChainState, StepInfo], None] | None = None,
) -> Tensor:
    """Walk ``x`` down ``config.ladder``: ``steps`` transitions per level (the ladder's ``first_steps`` more at the
    first, ``final_steps`` more at the last), then the denoising step and the clamp. Returns the samples."""
    ladder = config.ladder
    if ladder is None:
        raise ValueError("run_ladder needs a SamplerConfig with a ladder")
    if not energy.noise_conditioned:
        raise InvalidInputError(f"{energy.expression()} does not depend on a noise level, so a noise ladder has nothing"
                                " to anneal; valid choices: sample it without a ladder, or compose noise-conditioned"
                                " models")
    step_fn = SAMPLERS.get(config.method)
    sigmas = ladder.sigmas()
    done = 0
    for i, sigma in enumerate(sigmas):
        if i and ladder.predictor:  # the reverse-diffusion step from the previous level to this one
            previous = sigmas[i - 1]
            _, grad = energy.energy_and_grad(x, labels, sigma=previous)
            noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
            spread = (previous**2 - sigma**2) ** 0.5
            x = x - spread**2 * grad + sigma / previous * spread * noise
        level = AtLevel(energy, sigma)
        at = dataclasses.replace(config, step_size=config.step_size * sigma * sigma, ladder=None, clamp=False)
        state = evaluate(level, x, labels, config.precision)  # type: ignore[arg-type]
        extra = (ladder.first_steps if i == 0 else 0) + (config.final_steps if i == len(sigmas) - 1 else 0)
        state, done = transitions(step_fn, level, state, at, generator, labels, config.steps + extra, on_step, done)
        x = state.x
    if ladder.denoise:
        _, grad = energy.energy_and_grad(x, labels, sigma=sigmas[-1])
        x = x - sigmas[-1] ** 2 * grad
    return x.clamp(*energy.value_range) if energy.value_range is not None else x

