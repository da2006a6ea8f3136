"""MCMC transitions on an energy passed per call: a Langevin step and a MALA step.

State and diagnostics are separate records (as blackjax's ``MALAState`` / ``MALAInfo``): the
state caches the energy and gradient of its position, so MALA never recomputes them.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from composable_ebm.configs import MAX_TOTAL_STEPS, check_colour_basis, check_range, check_size
from composable_ebm.errors import InvalidInputError
from composable_ebm.sampling.augment import AugmentConfig

if TYPE_CHECKING:  # pragma: no cover; energies sit above the sampler
    from composable_ebm.energy import Energy, Labels

Precision = Literal["float32", "bfloat16"]


@dataclass(frozen=True)
class SamplerConfig:
    """Langevin / MALA settings and Algorithm 2's schedule.

    The defaults are the paper's 32x32 settings (appendix, "Experiment Configurations").
    """

    step_size: float = 500.0
    """lambda in x <- x - lambda * dE/dx + noise * N(0, 1)"""
    noise: float | Literal["exact"] | None = 0.001
    """std of the added noise; None or "exact": sqrt(2 * step_size) (exact Langevin)"""
    steps: int = 40
    """K: Langevin steps per round"""
    rounds: int = 1
    """N: rounds of [augmentation, K steps] (Algorithm 2)"""
    final_steps: int = 0
    """plain steps after the last round"""
    method: Literal["langevin", "mala"] = "langevin"
    """`langevin` (clamped Langevin steps) or `mala` (Metropolis-adjusted)."""
    augment: AugmentConfig | None = None
    """augmentation transition at the start of every round"""
    clamp: bool = True
    """clamp to the energy's value range (Langevin) / reject outside it (MALA)"""
    precision: Precision = "float32"
    """bfloat16: energy and gradient under autocast, update in float32"""
    init_scale: int = 1
    """chains start from uniform noise drawn at 1/init_scale of the image side and upsampled bilinearly
    (1: per-pixel uniform noise, Algorithm 2); larger values start from smooth colour fields"""
    augment_preserves: tuple[str, ...] | None = None
    """a model's own setting: which of its attributes ``augment`` leaves unchanged (its recipe records them); a
    composite keeps an augmentation only when every term's bound attributes are among its model's. None: not
    recorded, so a composite with this model runs no augmentation"""
    init_lead: tuple[tuple[float, float, float], ...] = ()
    """three RGB colours that take turns to lead the starting noise: each chain's uniform noise is drawn again until
    the colour given to it (each 1 in 3 of the chains) has the largest mean coordinate of the image, the image
    written in the colours' coordinates seen from `init_background`. Plain uniform noise leads with the colours
    unequally (the Shapes palette: green 0.51, red 0.41, blue 0.08 of 16x16 images), and a network blind to which
    of them an object has draws its object from the colour that leads. Empty: plain uniform noise (Algorithm 2)"""
    init_background: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """the colour that `init_lead`'s coordinates start from (RGB)"""
    guidance_scale: float = 1.0
    """a model's own setting for guided composites: its term ``E(x | c) - E(x | 0)`` is multiplied by it on top
    of the weight written in the expression (classifier-free guidance's scale); no effect on anything else"""

    def __post_init__(self) -> None:
        if self.noise == "exact":  # spelling for recipe files, which have no null
            object.__setattr__(self, "noise", None)
        check_range("SamplerConfig", "step_size", self.step_size, 0.0, low_open=True)
        if self.noise is not None:
            check_range("SamplerConfig", "noise", self.noise, 0.0)
        for name in ("steps", "final_steps"):
            check_size("SamplerConfig", name, getattr(self, name), low=0, high=1 << 24)
        check_size("SamplerConfig", "rounds", self.rounds, high=1 << 20)
        check_size("SamplerConfig", "init_scale", self.init_scale, high=1 << 12)
        if self.augment_preserves is not None:
            if isinstance(self.augment_preserves, str) or not all(isinstance(a, str) for a in self.augment_preserves):
                raise InvalidInputError(
                    f"SamplerConfig.augment_preserves must be a list of attribute names, got {self.augment_preserves!r}")
            object.__setattr__(self, "augment_preserves", tuple(self.augment_preserves))
        check_range("SamplerConfig", "guidance_scale", self.guidance_scale, 0.0, 100.0, low_open=True)
        self._check_init_lead()
        if self.steps < 0 or self.rounds < 1 or self.final_steps < 0:
            raise ValueError(
                f"need steps >= 0, rounds >= 1, final_steps >= 0; got {self.steps}, {self.rounds}, {self.final_steps}"
            )
        if self.total_steps > MAX_TOTAL_STEPS:
            raise InvalidInputError(
                f"SamplerConfig: rounds x steps + final_steps = {self.rounds} x {self.steps} + {self.final_steps}"
                f" = {self.total_steps:,} Langevin steps; at most {MAX_TOTAL_STEPS:,}")
        if self.method not in ("langevin", "mala"):
            raise ValueError(f"unknown method {self.method!r}; valid choices: ['langevin', 'mala']")
        if self.precision not in ("float32", "bfloat16"):
            raise ValueError(f"unknown precision {self.precision!r}; valid choices: ['float32', 'bfloat16']")

    def _check_init_lead(self) -> None:
        """`init_lead` and `init_background` as tuples of floats; three colours that point three ways, or none."""
        def colour(value: object, name: str) -> tuple[float, float, float]:
            if (isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 3
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
                raise InvalidInputError(f"SamplerConfig.{name} must be an RGB colour of three numbers, got {value!r}")
            return tuple(float(v) for v in value)

        object.__setattr__(self, "init_background", colour(self.init_background, "init_background"))
        if isinstance(self.init_lead, (str, bytes)) or not hasattr(self.init_lead, "__len__"):
            raise InvalidInputError(f"SamplerConfig.init_lead must be a list of three RGB colours, got {self.init_lead!r}")
        if len(self.init_lead) == 0:
            object.__setattr__(self, "init_lead", ())
            return
        if len(self.init_lead) != 3:
            raise InvalidInputError(
                f"SamplerConfig.init_lead needs 3 colours (got {len(self.init_lead)}); an empty list switches it off")
        lead = tuple(colour(c, "init_lead") for c in self.init_lead)
        object.__setattr__(self, "init_lead", lead)
        check_colour_basis("SamplerConfig", "init_lead", lead, "init_background", self.init_background)

    @property
    def noise_std(self) -> float:
        return (2.0 * self.step_size) ** 0.5 if self.noise is None else self.noise

    @property
    def total_steps(self) -> int:
        return self.rounds * self.steps + self.final_steps


@dataclass
class ChainState:
    """Position of every chain with its cached energy ``(B,)`` and gradient ``dE/dx``."""

    x: Tensor
    energy: Tensor
    grad: Tensor


@dataclass
class StepInfo:
    """Diagnostics of one transition (tensors, so recording them never synchronises the device)."""

    energy: Tensor  # mean energy after the step, scalar
    grad_norm: Tensor  # mean per-chain L2 norm of dE/dx at the step's start, scalar
    accepted: Tensor | None  # MALA: per-chain bool (B,); Langevin: None


def _autocast(x: Tensor, precision: Precision):
    if precision == "bfloat16":
        return torch.autocast(device_type=x.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def evaluate(
    energy: Energy, x: Tensor, labels: Labels | None, precision: Precision = "float32", create_graph: bool = False
) -> ChainState:
    """Energy and ``dE/dx`` at ``x``; under bf16 autocast the results are returned in ``x``'s dtype."""
    with _autocast(x, precision):
        e, g = energy.energy_and_grad(x, labels, create_graph=create_graph)
    return ChainState(x, e.to(x.dtype), g.to(x.dtype))


def clamp_bounds(energy: Energy, config: SamplerConfig) -> tuple[float, float] | None:
    """The range samples are clamped to (Langevin) or kept in (MALA): the energy's, unless ``clamp`` is off."""
    return energy.value_range if config.clamp else None


def langevin_update(
    x: Tensor, grad: Tensor, config: SamplerConfig, noise: Tensor, bounds: tuple[float, float] | None
) -> Tensor:
    """``clamp(x - step_size * grad + noise_std * noise)``; differentiable in ``grad`` when it carries a graph."""
    x = x - config.step_size * grad + config.noise_std * noise
    return x.clamp(*bounds) if bounds is not None else x


def langevin_move(energy: Energy, state: ChainState, config: SamplerConfig, generator: torch.Generator) -> Tensor:
    """One Langevin move from an evaluated state: draw the noise, update, clamp. The new position is left
    unevaluated; it carries a graph to the parameters when ``state.grad`` does."""
    noise = torch.randn(state.x.shape, generator=generator, device=state.x.device, dtype=state.x.dtype)
    return langevin_update(state.x, state.grad, config, noise, clamp_bounds(energy, config))


def differentiable_last_step(
    energy: Energy,
    x: Tensor,
    config: SamplerConfig,
    generator: torch.Generator,
    labels: Labels | None = None,
    create_graph: bool = True,
) -> tuple[Tensor, ChainState]:
    """The last Langevin step of a chain with a graph to the parameters: ``E`` and ``dE/dx`` at ``x`` (with
    ``create_graph``), then `langevin_move`. Returns ``(x_hat, state at x)``.

    The trainer's objective runs it inside its forward (Algorithm 1's ``x^``, which the KL loss
    differentiates through); ``x_hat.detach()`` is the chain's last sample, the same position a chain
    of `run_chain` reaches with the same generator.
    """
    start = evaluate(energy, x, labels, config.precision, create_graph=create_graph)
    return langevin_move(energy, start, config, generator), start


def langevin_step(
    energy: Energy,
    state: ChainState,
    config: SamplerConfig,
    generator: torch.Generator,
    labels: Labels | None = None,
) -> tuple[ChainState, StepInfo]:
    """``x <- clamp(x - step_size * dE/dx + noise * N(0, 1))`` (Algorithm 2's inner step), evaluated at the new ``x``."""
    new = evaluate(energy, langevin_move(energy, state, config, generator), labels, config.precision)
    info = StepInfo(new.energy.mean(), chain_grad_norm(state.grad), None)
    return new, info


def chain_grad_norm(grad: Tensor) -> Tensor:
    """Mean over chains of the L2 norm of ``dE/dx``, a scalar tensor (no device sync)."""
    return grad.flatten(1).norm(dim=1).mean()


def _log_proposal(to: Tensor, frm: Tensor, grad_frm: Tensor, step: float, std: float) -> Tensor:
    """log q(to | frm) up to a constant, for the proposal N(frm - step * grad, std^2 I). ``(B,)``."""
    diff = (to - frm + step * grad_frm).flatten(1)
    return -(diff * diff).sum(dim=1) / (2 * std * std)


def mala_step(
    energy: Energy,
    state: ChainState,
    config: SamplerConfig,
    generator: torch.Generator,
    labels: Labels | None = None,
) -> tuple[ChainState, StepInfo]:
    """Metropolis-adjusted Langevin: the Langevin proposal with a per-chain accept/reject.

    Targets ``exp(-E)`` exactly for any step size and noise (restricted to the value range,
    where proposals outside it are rejected).
    """
    std = config.noise_std
    if std <= 0:
        raise ValueError("MALA needs noise > 0 (noise=None gives the exact-Langevin sqrt(2 * step_size))")
    x = state.x
    noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    proposal = x - config.step_size * state.grad + std * noise
    prop = evaluate(energy, proposal, labels, config.precision)
    log_alpha = (
        state.energy
        - prop.energy
        + _log_proposal(x, proposal, prop.grad, config.step_size, std)
        - _log_proposal(proposal, x, state.grad, config.step_size, std)
    )
    bounds = clamp_bounds(energy, config)
    if bounds is not None:
        inside = ((proposal >= bounds[0]) & (proposal <= bounds[1])).flatten(1).all(dim=1)
        log_alpha = torch.where(inside, log_alpha, torch.full_like(log_alpha, -torch.inf))
    u = torch.rand(x.shape[0], generator=generator, device=x.device, dtype=x.dtype)
    accept = torch.log(u) < log_alpha  # NaN log_alpha (a non-finite energy) rejects
    shape = (-1,) + (1,) * (x.ndim - 1)
    new = ChainState(
        torch.where(accept.view(shape), proposal, x),
        torch.where(accept, prop.energy, state.energy),
        torch.where(accept.view(shape), prop.grad, state.grad),
    )
    return new, StepInfo(new.energy.mean(), chain_grad_norm(state.grad), accept)
