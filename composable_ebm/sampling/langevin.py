"""The Langevin chain of an energy without noise levels: Algorithm 2 of Du et al. 2021 ("EBM sampling algorithm").

Chains start from uniform noise over the value range (or a given batch), then run ``rounds`` times one augmentation
transition and ``steps`` transitions of a registered step (Langevin, MALA, HMC), then ``final_steps`` more.
`SamplerConfig` holds the settings and is the chain (`composable_ebm.sampling.chain.Chain`); `algorithm2` runs it,
for `composable_ebm.sampling.runner.sample` and for the trainer's negatives alike.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from composable_ebm.accel.precision import Precision
from composable_ebm.configs import MAX_TOTAL_STEPS, check_range, check_size
from composable_ebm.errors import InvalidInputError
from composable_ebm.sampling.augment import AugmentConfig, augment
from composable_ebm.sampling.chain import ChainEnd, OnStep, run_transitions
from composable_ebm.sampling.transitions import (SAMPLERS, ChainState, Step, check_bool, check_method,
                                                 check_precision, evaluate, langevin_move)

if TYPE_CHECKING:  # pragma: no cover; the chain runs any energy it is handed and imports none
    from composable_ebm.energy import Energy, Labels


@dataclass(frozen=True)
class SamplerConfig:
    """Langevin / MALA / HMC settings and Algorithm 2's schedule: the chain of an energy without noise levels (a
    noise-conditioned energy walks a `composable_ebm.sampling.annealed.LadderConfig`).

    The defaults are the paper's 32x32 settings (appendix, "Experiment Configurations"). It is a
    `composable_ebm.sampling.chain.Chain`: `run` is `algorithm2`.
    """

    family: ClassVar[str] = "a Langevin chain (SamplerConfig)"
    noise_levels: ClassVar[bool] = False

    step_size: float = 500.0
    """lambda in x <- x - lambda * dE/dx + noise * N(0, 1)"""
    noise: float | Literal["exact"] = 0.001
    """std of the added noise; ``"exact"``: sqrt(2 * step_size) (Langevin dynamics proper)"""
    steps: int = 40
    """K: Langevin steps per round"""
    rounds: int = 1
    """N: rounds of [augmentation, K steps] (Algorithm 2)"""
    final_steps: int = 0
    """plain steps after the last round"""
    method: str = "langevin"
    """a registered sampler (`SAMPLERS`): `langevin` (clamped Langevin steps), `mala` (Metropolis-adjusted) or `hmc`
    (Hamiltonian Monte Carlo, `leapfrog` steps per proposal, Metropolis-adjusted)"""
    leapfrog: int = 3
    """hmc: leapfrog steps per proposal, each of step ``sqrt(2 * step_size)`` (one leapfrog step is MALA's
    proposal with exact noise)"""
    augment: AugmentConfig | None = None
    """augmentation transition at the start of every round"""
    clamp: bool = True
    """clamp to the energy's value range (Langevin) / reject outside it (MALA)"""
    precision: Precision = "float32"
    """bfloat16: energy and gradient under autocast, update in float32"""
    init_scale: int = 1
    """chains start from uniform noise drawn at 1/init_scale of the image side and upsampled bilinearly
    (1: per-pixel uniform noise, Algorithm 2); larger values start from smooth colour fields"""
    adapt: int = 0
    """transitions before the first round that adapt ``step_size`` towards ``target_acceptance`` (a method with an
    accept/reject step: mala, hmc); the rounds run at the adapted size, which the result's config reports. 0: none"""
    target_acceptance: float = 0.574
    """the acceptance ``adapt`` aims at (0.574: MALA's optimum in high dimension, Roberts and Rosenthal 1998)"""

    def __post_init__(self) -> None:
        check_range("SamplerConfig", "step_size", self.step_size, 0.0, low_open=True)
        if self.noise != "exact":
            if self.noise is None or isinstance(self.noise, str):
                raise InvalidInputError(f"SamplerConfig.noise must be a number or \"exact\" (sqrt(2 * step_size)),"
                                        f" got {self.noise!r}")
            check_range("SamplerConfig", "noise", self.noise, 0.0)
        for name in ("steps", "final_steps"):
            check_size("SamplerConfig", name, getattr(self, name), low=0, high=1 << 24)
        check_size("SamplerConfig", "rounds", self.rounds, high=1 << 20)
        check_size("SamplerConfig", "init_scale", self.init_scale, high=1 << 12)
        check_size("SamplerConfig", "leapfrog", self.leapfrog, high=1 << 10)
        check_size("SamplerConfig", "adapt", self.adapt, low=0, high=1 << 20)
        check_range("SamplerConfig", "target_acceptance", self.target_acceptance, 0.0, 1.0, low_open=True,
                    high_open=True)
        if self.adapt and self.method == "langevin":
            raise InvalidInputError("SamplerConfig.adapt adapts the step size to an acceptance, and langevin has no"
                                    " accept/reject step; valid choices: method mala or hmc, or adapt = 0")
        check_bool("SamplerConfig", "clamp", self.clamp)
        if self.total_steps > MAX_TOTAL_STEPS:
            raise InvalidInputError(f"SamplerConfig: adapt + rounds x steps + final_steps = {self.adapt} + {self.rounds}"
                                    f" x {self.steps} + {self.final_steps} = {self.total_steps:,} Langevin steps; at"
                                    f" most {MAX_TOTAL_STEPS:,}")
        check_method(self.method)
        check_precision("SamplerConfig", self.precision)

    def summary(self) -> str:
        """The schedule in one line, e.g. ``langevin, 1 x 60 steps, step size 20, noise 0.005`` (``cebm info``, the
        studio)."""
        noise = "exact noise" if self.noise == "exact" else f"noise {self.noise:g}"
        extra = f" + {self.final_steps}" if self.final_steps else ""
        adapt = (f", the step size adapted over {self.adapt} transitions first towards acceptance"
                 f" {self.target_acceptance:g}" if self.adapt else "")
        return (f"{self.method}, {self.rounds} x {self.steps} steps{extra}, step size {self.step_size:g}, {noise}"
                + (", augmented" if self.augment else "") + adapt)

    def check(self, energy: Energy) -> None:
        """One line unless this chain can run ``energy``: augmentation transitions need images ``(C, H, W)``."""
        if self.augment is not None and len(energy.input_shape) != 3:
            raise InvalidInputError(f"augmentation transitions need image energies (C, H, W); this one takes"
                                    f" {energy.input_shape}")

    def within(self, levels: tuple[float, float] | None) -> SamplerConfig:
        """Itself: a Langevin chain walks no noise levels."""
        return self

    def noise_span(self) -> None:
        """None: it walks no noise levels."""
        return None

    def start(self, energy: Energy, n: int, generator: torch.Generator, device: torch.device) -> Tensor:
        """Uniform noise over the value range (`initial_noise`, at ``1/init_scale`` of the image side)."""
        return initial_noise(energy, n, generator, device, self.init_scale)

    def run(self, energy: Energy, x: Tensor, generator: torch.Generator, labels: Labels | None = None, *,
            on_step: OnStep | None = None, cuda_graphs: bool = False) -> ChainEnd:
        """The whole chain (`algorithm2`)."""
        return algorithm2(energy, x, self, generator, labels, on_step=on_step, cuda_graphs=cuda_graphs)

    @property
    def noise_std(self) -> float:
        return (2.0 * self.step_size) ** 0.5 if self.noise == "exact" else float(self.noise)

    @property
    def total_steps(self) -> int:
        """Transitions per chain: ``adapt + rounds * steps + final_steps``."""
        return self.adapt + self.rounds * self.steps + self.final_steps


def algorithm2(energy: Energy, x: Tensor, config: SamplerConfig, generator: torch.Generator,
               labels: Labels | None = None, *, num_steps: int | None = None, on_step: OnStep | None = None,
               cuda_graphs: bool = False) -> ChainEnd:
    """Algorithm 2 from ``x``: ``rounds`` x [augmentation transition, ``steps`` steps], then ``final_steps`` steps
    (after ``adapt`` transitions that adapt the step size, `adapt_step_size`, where asked).

    Args:
        num_steps: stop after this many steps (default: the whole schedule, ``config.total_steps``).
        on_step: ``on_step(step, state, info)`` after every step. Without it, the position after a last Langevin
            step is returned unevaluated (``ChainEnd.state`` is ``None``): no energy is computed that nobody reads.
            The trainer goes on from there with `composable_ebm.sampling.differentiable_last_step`.
        cuda_graphs: replay runs of identical steps from CUDA graphs where they can be.
    """
    total = config.total_steps if num_steps is None else num_steps
    if not 0 <= total <= config.total_steps:
        raise ValueError(f"num_steps must be in 0..{config.total_steps} for this schedule, got {num_steps}")
    step = SAMPLERS.get(config.method)
    state, done, adapted = None, 0, None
    if config.adapt and total:
        state, adapted, done = adapt_step_size(step, energy, evaluate(energy, x, labels, config.precision), config,
                                               generator, labels, min(config.adapt, total), on_step)
        config = adapted
    schedule = [config.steps] * config.rounds + ([config.final_steps] if config.final_steps else [])
    for round_index, steps_this_round in enumerate(schedule):
        if done == total:
            break
        if round_index < config.rounds and config.augment is not None:  # the augmentation transition
            x, state = augment(state.x if state is not None else x, config.augment, generator), None
        count = min(steps_this_round, total - done)
        if count == 0:
            continue
        if state is None:
            state = evaluate(energy, x, labels, config.precision)
        # nobody reads the last position's energy: leave it unevaluated
        leave_last = done + count == total and on_step is None and config.method == "langevin"
        state, done = run_transitions(step, energy, state, config, generator, labels, count - leave_last, on_step,
                                      done, cuda_graphs)
        if leave_last:
            return ChainEnd(langevin_move(energy, state, config, generator), None, done + 1, adapted)
    return ChainEnd(state.x if state is not None else x, state, done, adapted)


def adapt_step_size(step: Step, energy: Energy, state: ChainState, config: SamplerConfig, generator: torch.Generator,
                    labels: Labels | None, count: int, on_step: OnStep | None) -> tuple[ChainState, SamplerConfig, int]:
    """``count`` transitions that move the step size's logarithm by ``(acceptance - target) / sqrt(t)`` after the
    ``t``-th (a Robbins-Monro recursion on the chains' mean acceptance); the settings then take the mean of the
    logarithms over the second half. Returns the state, the adapted settings and the step count."""
    log_step, late = math.log(config.step_size), []
    for t in range(1, count + 1):
        state, info = step(energy, state, config, generator, labels)
        if info.accepted is None:
            raise InvalidInputError(f"SamplerConfig.adapt needs a method with an accept/reject step; {config.method}"
                                    " has none (valid: mala, hmc)")
        log_step += (float(info.accepted.float().mean()) - config.target_acceptance) / math.sqrt(t)
        log_step = min(max(log_step, -80.0), 80.0)  # a step of exp(+-80) is no step: the bound keeps it a number
        config = dataclasses.replace(config, step_size=math.exp(log_step))
        late += [log_step] if t > count // 2 else []
        if on_step is not None:
            on_step(t, state, info)
    return state, dataclasses.replace(config, step_size=math.exp(sum(late) / len(late))), count


def initial_noise(energy: Energy, n: int, generator: torch.Generator, device: torch.device,
                  init_scale: int = 1) -> Tensor:
    """Uniform noise over the value range (standard normal for unbounded energies).

    With ``init_scale`` > 1 an image energy's noise is drawn at ``1/init_scale`` of each side and upsampled
    bilinearly: smooth random colour fields, still spanning the value range.
    """
    shape = (n, *energy.input_shape)
    smooth = init_scale > 1 and len(shape) == 4
    if smooth:
        shape = (*shape[:2], *(max(1, -(-s // init_scale)) for s in shape[2:]))
    if energy.value_range is None:
        x = torch.randn(shape, generator=generator, device=device)
    else:
        lo, hi = energy.value_range
        x = lo + (hi - lo) * torch.rand(shape, generator=generator, device=device)
    if smooth:
        x = F.interpolate(x, size=energy.input_shape[1:], mode="bilinear", align_corners=False)
    return x
