"""Annealed sampling of noise-conditioned energies: any registered transition, level by level down a noise ladder
(`LadderConfig`, the settings a noise-conditioned model samples with, as `SamplerConfig` is a plain energy's).

Between levels the chain takes the reverse-diffusion step: from level ``s`` to ``s'`` it moves to a draw of the
noised image at ``s'`` given the one at ``s`` and the denoised estimate ``x - s^2 dE/dx`` (the Gaussian posterior
of a variance-exploding diffusion), ``x - (s^2 - s'^2) dE/dx + (s' / s) sqrt(s^2 - s'^2) z``. At level ``sigma``
the chain runs the transition (`langevin`, `mala`, `hmc`, ...) on ``E(., sigma)`` with step size
``step_size * sigma^2`` and exact Langevin noise, so MALA and HMC correct every level with a per-chain
Metropolis-Hastings step on the sum's own energy (Du et al. 2023, "Reduce, Reuse, Recycle": an energy, unlike a
summed score, makes that correction possible). The positions are not clamped on the way down (noised data leaves
the pixel range); the last one is denoised (`LadderConfig.denoise`) and clamped to the value range.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from torch import Tensor

from composable_ebm.configs import MAX_TOTAL_STEPS, check_range, check_size
from composable_ebm.errors import InvalidInputError
from composable_ebm.sampling.chain import ChainEnd, OnStep, run_transitions
from composable_ebm.sampling.langevin import SamplerConfig
from composable_ebm.sampling.transitions import (
    SAMPLERS,
    ChainState,
    Precision,
    check_bool,
    check_method,
    check_precision,
    evaluate,
)

if TYPE_CHECKING:  # pragma: no cover; the sampler runs any energy it is handed and imports none
    from composable_ebm.energy import Energy, Labels


@dataclass(frozen=True)
class LadderConfig:
    """How a noise-conditioned energy (`composable_ebm.energy.NoiseConditioned`) is sampled: down a ladder of noise
    levels.

    Chains start from the value range's centre plus Gaussian noise of std ``sigma_max`` and run ``steps``
    transitions of ``method`` at each level, with step size ``step_size * sigma^2`` (Song & Ermon 2019's annealed
    Langevin dynamics: ``alpha_i`` proportional to ``sigma_i^2``) and exact Langevin noise, moving from one level to
    the next by the reverse-diffusion step or another `predictor`; then, with ``denoise``, one step to the noise's
    posterior mean at the last level (Tweedie's formula, ``x - sigma^2 dE/dx``), and the result is clamped to the
    value range. It is a `composable_ebm.sampling.chain.Chain`: `run` is `run_ladder`.
    """

    family: ClassVar[str] = "a noise ladder (LadderConfig)"
    noise_levels: ClassVar[bool] = True
    augment: ClassVar[None] = None  # a ladder runs no augmentation transitions

    levels: int = 30
    """how many levels, ``sigma_max`` first and ``sigma_min`` last"""
    sigma_min: float = 0.01
    """the last level (the data's scale: [0, 1] pixels)"""
    sigma_max: float = 1.0
    """the first level"""
    spacing: Literal["geometric", "karras"] = "geometric"
    """geometric: equal ratios; karras: Karras et al. 2022's ``rho = 7`` spacing, more levels at low noise"""
    method: str = "mala"
    """the transition run at each level (a registered sampler: `langevin`, `mala`, `hmc`)"""
    steps: int = 2
    """transitions at each level"""
    step_size: float = 0.2
    """a level's step size over ``sigma^2``"""
    predictor: Literal["ancestral", "heun", "none"] = "ancestral"
    """how a chain moves from one level to the next, so the transitions at each level correct a chain that is
    already close to it (the predictor-corrector scheme of Song et al. 2021, as Du et al. 2023 sample):
    ``ancestral``, the reverse-diffusion step (a draw of the next level's noised image given the current one and the
    denoised estimate ``x - sigma^2 dE/dx``); ``heun``, a deterministic second-order step along the probability-flow
    ODE ``dx/dsigma = sigma dE/dx`` (Karras et al. 2022, Algorithm 1), one evaluation more per level; ``none``, the
    transitions alone"""
    churn: float = 0.0
    """heun (the other predictors ignore it): before each step, fresh noise raises the chains' level from ``sigma`` to
    ``sigma (1 + churn)`` (at most ``sigma_max``), and the step starts there (Karras et al. 2022, Algorithm 2's
    ``gamma``): a stochastic sampler that forgets the errors of earlier steps, at one evaluation more per level"""
    denoise: bool = True
    """finish with the posterior-mean step at ``sigma_min``"""
    first_steps: int = 0
    """transitions at the first level before its own ``steps``: the chains start from the value range's centre plus
    noise of std ``sigma_max``, which is the noised data's distribution at that level only when ``sigma_max`` dwarfs
    the data's spread; these steps let the chains reach it before the descent"""
    final_steps: int = 0
    """transitions at the last level after its own ``steps``"""
    leapfrog: int = 3
    """hmc: leapfrog steps per proposal"""
    precision: Precision = "float32"
    """bfloat16: energy and gradient under autocast, update in float32"""

    def __post_init__(self) -> None:
        owner = "LadderConfig"
        check_size(owner, "levels", self.levels, high=1 << 16)
        for name in ("steps", "first_steps", "final_steps"):
            check_size(owner, name, getattr(self, name), low=0, high=1 << 24)
        check_size(owner, "leapfrog", self.leapfrog, high=1 << 10)
        check_range(owner, "sigma_min", self.sigma_min, 0.0, low_open=True)
        check_range(owner, "sigma_max", self.sigma_max, self.sigma_min, 1e4)
        check_range(owner, "step_size", self.step_size, 0.0, low_open=True)
        check_range(owner, "churn", self.churn, 0.0, 1.0)
        if self.spacing not in ("geometric", "karras"):
            raise InvalidInputError(f"unknown LadderConfig.spacing {self.spacing!r}; valid choices: ['geometric', 'karras']")
        if self.predictor not in PREDICTORS:  # defined below: one function per predictor
            raise InvalidInputError(f"unknown LadderConfig.predictor {self.predictor!r}; valid choices: {list(PREDICTORS)}")
        check_bool(owner, "denoise", self.denoise)
        check_method(self.method)
        check_precision(owner, self.precision)
        if self.total_steps > MAX_TOTAL_STEPS:
            raise InvalidInputError(f"LadderConfig: first_steps + levels x steps + final_steps = {self.first_steps} +"
                                    f" {self.levels} x {self.steps} + {self.final_steps} = {self.total_steps:,}"
                                    f" transitions; at most {MAX_TOTAL_STEPS:,}")

    def sigmas(self) -> list[float]:
        """The levels, highest first."""
        n, lo, hi = self.levels, self.sigma_min, self.sigma_max
        if n == 1:
            return [lo]
        if self.spacing == "geometric":
            return [hi * (lo / hi) ** (i / (n - 1)) for i in range(n)]
        rho = 7.0
        return [(hi ** (1 / rho) + i / (n - 1) * (lo ** (1 / rho) - hi ** (1 / rho))) ** rho for i in range(n)]

    def at_level(self, sigma: float) -> SamplerConfig:
        """The chain settings of the transitions at level ``sigma``: step ``step_size * sigma^2``, exact noise, no
        clamp (noised positions leave the value range)."""
        return SamplerConfig(step_size=self.step_size * sigma * sigma, noise="exact", steps=self.steps,
                             method=self.method, leapfrog=self.leapfrog, clamp=False, precision=self.precision)

    def summary(self) -> str:
        """The schedule in one line (``cebm info``, the studio)."""
        ladder = f"{self.levels} noise levels ({self.sigma_max:g} to {self.sigma_min:g}, {self.spacing})"
        churned = f" (churn {self.churn:g})" if self.churn and self.predictor == "heun" else ""
        between = "" if self.predictor == "none" else f", {self.predictor} steps{churned} between them"
        denoised = ", denoised" if self.denoise else ""
        if self.total_steps == 0:
            return f"{ladder}{between}, no transitions at a level{denoised}"
        first = f"{self.first_steps} steps at the first level, then " if self.first_steps else ""
        extra = f" + {self.final_steps}" if self.final_steps else ""
        steps = f"{self.steps} step" + ("" if self.steps == 1 and not self.final_steps else "s")
        return (f"{self.method}, {first}{steps}{extra} at each of {ladder}{between}, step size"
                f" {self.step_size:g} x sigma^2, exact noise{denoised}")

    def check(self, energy: Energy) -> None:
        """One line unless ``energy`` depends on a noise level: a ladder has nothing to anneal otherwise."""
        if not energy.noise_conditioned:
            raise InvalidInputError(f"{energy.expression()} does not depend on a noise level, so a noise ladder has"
                                    " nothing to anneal; valid choices: sample it without a ladder, or compose"
                                    " noise-conditioned models")

    def within(self, levels: tuple[float, float] | None) -> LadderConfig:
        """The ladder cut to ``levels`` (lowest, highest: the levels every model of a composite was trained on): it
        starts at most at the highest and ends within them; itself for ``None``."""
        if levels is None:
            return self
        high = min(self.sigma_max, levels[1])
        return dataclasses.replace(self, sigma_min=min(max(self.sigma_min, levels[0]), high), sigma_max=high)

    def noise_span(self) -> tuple[float, float]:
        """The levels it walks: lowest, highest."""
        return self.sigma_min, self.sigma_max

    def start(self, energy: Energy, n: int, generator: torch.Generator, device: torch.device) -> Tensor:
        """The value range's centre (0 when unbounded) plus noise of std ``sigma_max``."""
        centre = 0.0 if energy.value_range is None else sum(energy.value_range) / 2
        return centre + self.sigma_max * torch.randn((n, *energy.input_shape), generator=generator, device=device)

    def run(self, energy: Energy, x: Tensor, generator: torch.Generator, labels: Labels | None = None, *,
            on_step: OnStep | None = None, cuda_graphs: bool = False) -> ChainEnd:
        """The walk down the ladder (`run_ladder`)."""
        return ChainEnd(run_ladder(energy, x, self, generator, labels, on_step=on_step, cuda_graphs=cuda_graphs),
                        None, self.total_steps)

    @property
    def total_steps(self) -> int:
        """Transitions per chain: ``first_steps + levels * steps + final_steps``."""
        return self.first_steps + self.levels * self.steps + self.final_steps

    def transitions_per_level(self) -> list[int]:
        """How many transitions run at each level, highest first (they sum to `total_steps`): a chain's per-step
        diagnostics (`SamplerDiagnostics.acceptance`) split level by level."""
        counts = [self.steps] * self.levels
        counts[0] += self.first_steps
        counts[-1] += self.final_steps
        return counts


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
        (`composable_ebm.accel.graphs`): the energy underneath, and the level."""
        return self.base, self.sigma


Predictor = Callable[..., Tensor]
"""``predictor(energy, x, grad, previous, sigma, generator, labels)``: the chains moved from level ``previous`` to
``sigma`` (``grad``: the energy's gradient at ``x`` at ``previous``)."""


def ancestral(energy: Energy, x: Tensor, grad: Tensor, previous: float, sigma: float, generator: torch.Generator,
              labels: Labels | None) -> Tensor:
    """The reverse-diffusion step: a draw of the noised image at ``sigma`` given the one at ``previous`` and the
    denoised estimate ``x - previous^2 dE/dx`` (the Gaussian posterior of a variance-exploding diffusion)."""
    noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    spread = (previous**2 - sigma**2) ** 0.5
    return x - spread**2 * grad + sigma / previous * spread * noise


def heun(energy: Energy, x: Tensor, grad: Tensor, previous: float, sigma: float, generator: torch.Generator,
         labels: Labels | None) -> Tensor:
    """Euler along the probability-flow ODE ``dx/dsigma = sigma dE/dx``, then the trapezoid with the slope where it
    lands (Karras et al. 2022, Algorithm 1): one evaluation more."""
    slope = previous * grad
    landed = x + (sigma - previous) * slope
    _, grad_there = energy.energy_and_grad(landed, labels, sigma=sigma)
    return x + (sigma - previous) * 0.5 * (slope + sigma * grad_there)


PREDICTORS: dict[str, Predictor | None] = {"ancestral": ancestral, "heun": heun, "none": None}
"""`LadderConfig.predictor` -> the step between levels (``none``: the transitions alone)."""


def run_ladder(energy: Energy, x: Tensor, config: LadderConfig, generator: torch.Generator,
               labels: Labels | None = None, *, on_step: OnStep | None = None, cuda_graphs: bool = False) -> Tensor:
    """Walk ``x`` down ``config``'s levels: the predictor from each level to the next, ``steps`` transitions at each
    level (``first_steps`` more at the first, ``final_steps`` more at the last), then the denoising step and the
    clamp. Returns the samples.

    The energy's gradient where the last transition left the chains is the one the step to the next level (and the
    denoising step) needs: it is read from the transition's state, not evaluated again, so a level costs one
    evaluation plus its transitions'."""
    config.check(energy)
    step, predict = SAMPLERS.get(config.method), PREDICTORS[config.predictor]
    sigmas, counts = config.sigmas(), config.transitions_per_level()
    done, state = 0, None  # the chains evaluated where they stand, at the level they stand at
    for i, sigma in enumerate(sigmas):
        if i and predict is not None:  # from the previous level to this one
            previous = sigmas[i - 1]
            raised = min(previous * (1 + config.churn), config.sigma_max) if predict is heun else previous
            if raised > previous:  # churn: fresh noise first, so the chains stand at a higher level
                noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
                x, previous, state = x + (raised**2 - previous**2) ** 0.5 * noise, raised, None
            grad = state.grad if state is not None else energy.energy_and_grad(x, labels, sigma=previous)[1]
            x, state = predict(energy, x, grad, previous, sigma, generator, labels), None
        if counts[i] == 0:  # no transition at this level: nothing to evaluate here
            state = None
            continue
        level = AtLevel(energy, sigma)
        state = evaluate(level, x, labels, config.precision)  # type: ignore[arg-type]
        state, done = run_transitions(step, level, state, config.at_level(sigma), generator, labels, counts[i],
                                      on_step, done, cuda_graphs)
        x = state.x
    if config.denoise:
        grad = state.grad if state is not None else energy.energy_and_grad(x, labels, sigma=sigmas[-1])[1]
        x = x - sigmas[-1] ** 2 * grad
    return x.clamp(*energy.value_range) if energy.value_range is not None else x
