"""MCMC transitions on an energy passed per call: a Langevin step, a MALA step and an HMC step, each with a
per-chain accept/reject where it has one, registered by name (`SAMPLERS`). The chains that run them are
`composable_ebm.sampling.langevin` (Algorithm 2) and `composable_ebm.sampling.annealed` (a noise ladder).

State and diagnostics are separate records (as blackjax's ``MALAState`` / ``MALAInfo``): the
state caches the energy and gradient of its position, so MALA never recomputes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from composable_ebm.accel.precision import PRECISIONS, Precision, autocast
from composable_ebm.errors import InvalidInputError
from composable_ebm.registry import Registry

if TYPE_CHECKING:  # pragma: no cover; energies sit above the sampler
    from composable_ebm.energy import Energy, Labels


Step = Callable[..., "tuple[ChainState, StepInfo]"]
"""A registered sampler: ``step(energy, state, config, generator, labels) -> (new state, info)``."""

SAMPLERS: Registry[Step] = Registry("sampler method", package="composable_ebm.sampling",
                                    group="composable_ebm.samplers")
"""The chain transitions `SamplerConfig.method` names: one file in `composable_ebm.sampling` (or an entry point
in the ``composable_ebm.samplers`` group) and ``@SAMPLERS.register("name")`` add one."""


class StepSettings(Protocol):
    """What a transition reads of its settings: a `composable_ebm.sampling.langevin.SamplerConfig`, or a noise
    ladder's settings at one level."""

    step_size: float
    leapfrog: int
    clamp: bool
    precision: Precision

    @property
    def noise_std(self) -> float: ...


def check_method(method: Any) -> None:
    """One line unless ``method`` names a registered transition."""
    if not isinstance(method, str) or method not in SAMPLERS:
        raise InvalidInputError(f"unknown sampler method {method!r}; valid choices: {SAMPLERS.names()}")


def check_precision(owner: str, precision: Any) -> None:
    """One line unless ``precision`` is one of `PRECISIONS`."""
    if precision not in PRECISIONS:
        raise InvalidInputError(f"unknown {owner}.precision {precision!r}; valid choices: {list(PRECISIONS)}")


def check_bool(owner: str, name: str, value: Any) -> None:
    """One line unless ``value`` is true or false."""
    if not isinstance(value, bool):
        raise InvalidInputError(f"{owner}.{name} must be true or false, got {value!r}")


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


def evaluate(
    energy: Energy, x: Tensor, labels: Labels | None, precision: Precision = "float32", create_graph: bool = False
) -> ChainState:
    """Energy and ``dE/dx`` at ``x``; under bf16 autocast the results are returned in ``x``'s dtype."""
    with autocast(x.device.type, precision):
        e, g = energy.energy_and_grad(x, labels, create_graph=create_graph)
    return ChainState(x, e.to(x.dtype), g.to(x.dtype))


def clamp_bounds(energy: Energy, config: StepSettings) -> tuple[float, float] | None:
    """The range samples are clamped to (Langevin) or kept in (MALA): the energy's, unless ``clamp`` is off."""
    return energy.value_range if config.clamp else None


def langevin_update(
    x: Tensor, grad: Tensor, config: StepSettings, noise: Tensor, bounds: tuple[float, float] | None
) -> Tensor:
    """``clamp(x - step_size * grad + noise_std * noise)``; differentiable in ``grad`` when it carries a graph."""
    x = x - config.step_size * grad + config.noise_std * noise
    return x.clamp(*bounds) if bounds is not None else x


def langevin_move(energy: Energy, state: ChainState, config: StepSettings, generator: torch.Generator) -> Tensor:
    """One Langevin move from an evaluated state: draw the noise, update, clamp. The new position is left
    unevaluated; it carries a graph to the parameters when ``state.grad`` does."""
    noise = torch.randn(state.x.shape, generator=generator, device=state.x.device, dtype=state.x.dtype)
    return langevin_update(state.x, state.grad, config, noise, clamp_bounds(energy, config))


def differentiable_last_step(
    energy: Energy,
    x: Tensor,
    config: StepSettings,
    generator: torch.Generator,
    labels: Labels | None = None,
    create_graph: bool = True,
) -> tuple[Tensor, ChainState]:
    """The last Langevin step of a chain with a graph to the parameters: ``E`` and ``dE/dx`` at ``x`` (with
    ``create_graph``), then `langevin_move`. Returns ``(x_hat, state at x)``.

    The trainer's objective runs it inside its forward (Algorithm 1's ``x^``, which the KL loss
    differentiates through); ``x_hat.detach()`` is the chain's last sample, the same position a chain
    of `composable_ebm.sampling.algorithm2` reaches with the same generator.
    """
    start = evaluate(energy, x, labels, config.precision, create_graph=create_graph)
    return langevin_move(energy, start, config, generator), start


@SAMPLERS.register("langevin")
def langevin_step(
    energy: Energy,
    state: ChainState,
    config: StepSettings,
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


@SAMPLERS.register("mala")
def mala_step(
    energy: Energy,
    state: ChainState,
    config: StepSettings,
    generator: torch.Generator,
    labels: Labels | None = None,
) -> tuple[ChainState, StepInfo]:
    """Metropolis-adjusted Langevin: the Langevin proposal with a per-chain accept/reject.

    Targets ``exp(-E)`` exactly for any step size and noise (restricted to the value range,
    where proposals outside it are rejected).
    """
    std = config.noise_std
    if std <= 0:
        raise ValueError("MALA needs noise > 0 (noise=\"exact\" gives the exact-Langevin sqrt(2 * step_size))")
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
        log_alpha = torch.where(_inside(proposal, bounds), log_alpha, torch.full_like(log_alpha, -torch.inf))
    return _metropolis(state, prop, log_alpha, generator)


def _inside(x: Tensor, bounds: tuple[float, float]) -> Tensor:
    """Per chain, whether every element of ``x`` lies within ``bounds``. ``(B,)`` bool."""
    return ((x >= bounds[0]) & (x <= bounds[1])).flatten(1).all(dim=1)


def _metropolis(state: ChainState, proposed: ChainState, log_alpha: Tensor,
                generator: torch.Generator) -> tuple[ChainState, StepInfo]:
    """Accept each chain's proposal with probability ``min(1, exp(log_alpha))``, one draw per chain; a NaN
    ``log_alpha`` (a non-finite energy) rejects. The state keeps the accepted positions' cached energy and gradient."""
    x = state.x
    u = torch.rand(x.shape[0], generator=generator, device=x.device, dtype=x.dtype)
    accept = torch.log(u) < log_alpha
    shape = (-1,) + (1,) * (x.ndim - 1)
    new = ChainState(
        torch.where(accept.view(shape), proposed.x, x),
        torch.where(accept, proposed.energy, state.energy),
        torch.where(accept.view(shape), proposed.grad, state.grad),
    )
    return new, StepInfo(new.energy.mean(), chain_grad_norm(state.grad), accept)


@SAMPLERS.register("hmc")
def hmc_step(
    energy: Energy,
    state: ChainState,
    config: StepSettings,
    generator: torch.Generator,
    labels: Labels | None = None,
) -> tuple[ChainState, StepInfo]:
    """Hamiltonian Monte Carlo: a fresh unit-Gaussian momentum, ``leapfrog`` leapfrog steps of size
    ``sqrt(2 * step_size)``, then a per-chain accept/reject on ``H = E + |p|^2 / 2`` (Neal 2011).

    Targets ``exp(-E)`` exactly (restricted to the value range: a trajectory that leaves it is rejected).
    """
    eps = (2.0 * config.step_size) ** 0.5
    x0 = state.x
    p = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
    h0 = state.energy + 0.5 * p.flatten(1).pow(2).sum(dim=1)
    bounds = clamp_bounds(energy, config)
    inside = torch.ones(x0.shape[0], dtype=torch.bool, device=x0.device)
    x, grad = x0, state.grad
    p = p - 0.5 * eps * grad
    cur = state
    for i in range(config.leapfrog):
        x = x + eps * p
        if bounds is not None:
            inside &= _inside(x, bounds)
        cur = evaluate(energy, x, labels, config.precision)
        p = p - (eps if i < config.leapfrog - 1 else 0.5 * eps) * cur.grad
    h1 = cur.energy + 0.5 * p.flatten(1).pow(2).sum(dim=1)
    log_alpha = torch.where(inside, h0 - h1, torch.full_like(h0, -torch.inf))
    return _metropolis(state, cur, log_alpha, generator)
