"""The chain runner: Algorithm 2 of Du et al. 2021 ("EBM sampling algorithm").

Start from uniform noise (or a given batch), then ``rounds`` times: one augmentation
transition and ``steps`` Langevin (or MALA) steps; then ``final_steps`` plain steps. A noise-conditioned energy's
settings are a `LadderConfig`, and its chains walk down the noise ladder instead (`run_ladder`).
The runner takes the energy per call and holds no model.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from composable_ebm.configs import config_from_dict, config_to_dict
from composable_ebm.errors import InvalidInputError, NonFiniteError
from composable_ebm.sampling.annealed import LadderConfig, ladder_start, run_ladder
from composable_ebm.sampling.augment import augment
from composable_ebm.accel.graphs import transitions
from composable_ebm.sampling.transitions import (
    ChainState,
    SamplerConfig,
    StepInfo,
    evaluate,
    langevin_move,
    SAMPLERS,
)

if TYPE_CHECKING:  # pragma: no cover; the sampler runs any energy it is handed and imports none
    from composable_ebm.energy import Energy, Labels

MAX_SAMPLES = 1 << 20
"""Most chains one call runs (``n``); the command line's ``-n`` has the same bound."""
MAX_SAMPLE_ELEMENTS = 1 << 30
"""Most elements of one call's batch of chains (``n`` times the input's size): 4 GiB in float32, before any
network activation."""


@dataclass
class SamplerDiagnostics:
    """Per-step records, each of shape ``(total_steps,)``."""

    energy: Tensor  # mean energy after each step
    grad_norm: Tensor  # mean L2 norm of dE/dx at each step's start
    acceptance: Tensor | None  # MALA (any sampler with an accept step): fraction accepted at each step; else None


@dataclass
class SampleResult:
    """What a sampler call returns; the fields do not depend on which options were set."""

    samples: Tensor  # (n, *input_shape), final states
    chain: Tensor | None  # (T, n, *input_shape): every keep_every-th state (first and last included), if asked
    diagnostics: SamplerDiagnostics
    config: SamplerConfig | LadderConfig  # the settings actually used

    @property
    def acceptance_rate(self) -> float | None:
        """Mean MALA acceptance over all steps (``None`` for Langevin)."""
        acc = self.diagnostics.acceptance
        return None if acc is None or acc.numel() == 0 else float(acc.mean())


StepCallback = Callable[[dict[str, Any]], None]
ChainSettings = SamplerConfig | LadderConfig
"""A chain's settings: a `SamplerConfig` (an energy without noise levels) or a `LadderConfig` (a noise-conditioned
one)."""


def check_count(n: object) -> int:
    """``n``, the number of samples, as an int; one line unless it is a whole number from 1 to `MAX_SAMPLES`."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= MAX_SAMPLES:
        raise InvalidInputError(f"n must be a whole number from 1 to {MAX_SAMPLES:,} (the number of samples), got"
                                f" {n!r}")
    return int(n)


def make_generator(seed: int | None, generator: torch.Generator | None, device: torch.device) -> torch.Generator:
    """An explicit generator on ``device``: the given one, or one seeded with ``seed``; without either, one seeded
    from torch's global generator, so ``torch.manual_seed`` makes a call repeat (and advances as any draw does)."""
    if generator is not None and seed is not None:
        raise ValueError("pass either seed= or generator=, not both")
    if generator is not None:
        if torch.device(generator.device).type != torch.device(device).type:
            raise ValueError(f"generator is on {generator.device} but the chains are on {device}")
        return generator
    gen = torch.Generator(device=device)
    if seed is None:
        gen.manual_seed(int(torch.randint(0, 2**62, (1,))))
    else:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**63:
            raise InvalidInputError(f"seed must be an integer in [0, 2^63 - 1], got {seed!r}")
        gen.manual_seed(int(seed))
    return gen


def with_overrides(config: ChainSettings, overrides: Mapping[str, Any], where: str = "") -> ChainSettings:
    """``config`` with overrides of its fields (per call, or a model's settings on its own); an unknown name is one
    line naming the valid ones (and ``where`` they were given, e.g. ``" in alone"``)."""
    if not overrides:
        return config
    kind = type(config)
    valid = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        family = "a noise ladder's" if kind is LadderConfig else "a chain's"
        raise InvalidInputError(f"unknown sampler setting(s) {unknown}{where}; valid settings ({family},"
                                f" {kind.__name__}): {sorted(valid)}")
    # through the config codec: every value type-checked as a recipe's would be (a table for augment becomes an
    # AugmentConfig, a string for steps is one line), then range-checked by the config itself
    plain = {k: (config_to_dict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v)
             for k, v in overrides.items()}
    return config_from_dict(kind, {**config_to_dict(config), **plain})


def initial_noise(energy: Energy, n: int, generator: torch.Generator, device: torch.device, init_scale: int = 1) -> Tensor:
    """Uniform noise over the value range (standard normal for unbounded energies).

    With ``init_scale`` > 1 an image energy's noise is drawn at ``1/init_scale`` of each side and
    upsampled bilinearly: smooth random colour fields, still spanning the value range.
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


def sample(
    energy: Energy,
    n: int | None = None,
    config: ChainSettings | None = None,
    *,
    x0: Tensor | None = None,
    labels: Labels | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    keep_every: int = 0,
    progress: bool = False,
    callback: StepCallback | None = None,
    **overrides: Any,
) -> SampleResult:
    """Run Algorithm 2 on ``energy`` as it is given and return a `SampleResult`.

    This is the sampler itself: it runs the energy it is handed with the settings it is handed. How an
    expression is sampled by default (its guided form, a model's own settings) is the pipeline's business:
    `composable_ebm.pipeline.sample`, which ``Energy.sample`` and the CLI call.

    Args:
        energy: any ``Energy``, composite or not (it is not modified, nor its modes or flags).
        n: number of chains (with ``x0`` omitted: started from uniform noise).
        config: sampler settings: a `SamplerConfig` (default: its defaults), or a `LadderConfig` for a
            noise-conditioned energy.
        x0: starting batch ``(n, *input_shape)`` instead of noise.
        labels: per-item attribute indices for a conditional energy.
        seed: explicit randomness; the same seed gives the same samples.
        generator: a ``torch.Generator`` to draw from instead of ``seed``.
        keep_every: keep every k-th state of the chain in ``result.chain`` (0: keep none).
        progress: show a progress bar.
        callback: called after every step with ``{"step", "x", "energy", "grad_norm", "accepted"}``.
        overrides: any field of the config, e.g. ``steps=100``.
    """
    cfg = with_overrides(config or SamplerConfig(), overrides)
    if isinstance(cfg, SamplerConfig) and cfg.augment is not None and len(energy.input_shape) != 3:
        raise ValueError(f"augmentation transitions need image energies (C, H, W); this one takes {energy.input_shape}")
    if x0 is None:
        n = check_count(n)
        size = math.prod(energy.input_shape)
        if n * size > MAX_SAMPLE_ELEMENTS:
            raise InvalidInputError(f"n={n:,} samples of shape {tuple(energy.input_shape)} are {n * size:,} elements;"
                                    f" one call draws at most {MAX_SAMPLE_ELEMENTS:,}: n <= {MAX_SAMPLE_ELEMENTS // size:,},"
                                    " or draw in several calls")
        dev = torch.device(device) if device is not None else energy.device
        gen = make_generator(seed, generator, dev)
        x = (ladder_start(energy, n, cfg, gen, dev) if isinstance(cfg, LadderConfig)
             else initial_noise(energy, n, gen, dev, cfg.init_scale))
    else:
        if n is not None and n != x0.shape[0]:
            raise ValueError(f"n={n} disagrees with x0's batch of {x0.shape[0]}")
        x = x0.detach().to(torch.float32).clone()
        gen = make_generator(seed, generator, x.device)
    energies, grad_norms, accepts = [], [], []
    kept = [x.clone()] if keep_every > 0 else []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.total_steps, desc="sampling", unit="step", leave=False, disable=None)  # terminals only

    def on_step(step: int, state: ChainState, info: StepInfo) -> None:
        _record(info, energies, grad_norms, accepts)
        if keep_every > 0 and (step % keep_every == 0 or step == cfg.total_steps):
            kept.append(state.x.clone())
        if callback is not None:
            callback({"step": step, "x": state.x, "energy": info.energy, "grad_norm": info.grad_norm,
                      "accepted": info.accepted})
        if bar is not None:
            bar.update(1)

    end = run_chain(energy, x, cfg, gen, labels, on_step=on_step)
    if bar is not None:
        bar.close()
    final = end.x
    if not bool(torch.isfinite(final).all()) or (energies and not bool(torch.isfinite(energies[-1]))):
        raise NonFiniteError(
            f"sampling {energy.expression()} produced non-finite energies or samples; check the model's weights"
            " (a model with NaN weights) or lower the step size"
        )
    diagnostics = SamplerDiagnostics(
        energy=torch.stack(energies).float().cpu() if energies else torch.empty(0),
        grad_norm=torch.stack(grad_norms).float().cpu() if grad_norms else torch.empty(0),
        acceptance=torch.stack(accepts).cpu() if accepts else None,  # samplers with an accept/reject step
    )
    chain = torch.stack(kept) if kept else None
    return SampleResult(final.detach(), chain, diagnostics, cfg)


@dataclass
class ChainEnd:
    """Where `run_chain` stopped: the positions, and their cached energy and gradient when evaluated."""

    x: Tensor
    state: ChainState | None  # None when the last Langevin step's result was left unevaluated
    steps: int


def run_chain(
    energy: Energy,
    x: Tensor,
    config: ChainSettings,
    generator: torch.Generator,
    labels: Labels | None = None,
    *,
    num_steps: int | None = None,
    on_step: Callable[[int, ChainState, StepInfo], None] | None = None,
) -> ChainEnd:
    """The chain of Algorithm 2 from ``x``: ``rounds`` x [augmentation transition, ``steps`` steps], then
    ``final_steps`` steps, or with a `LadderConfig` the walk down its levels. ``sample`` and the trainer both run
    their chains through here.

    Args:
        num_steps: stop after this many steps (default: the whole schedule, ``config.total_steps``).
        on_step: ``on_step(step, state, info)`` after every step (step counts from 1). Without it, the
            position after a last Langevin step is returned unevaluated (``ChainEnd.state`` is ``None``):
            no energy is computed that nobody reads. The trainer goes on from there with
            `composable_ebm.sampling.differentiable_last_step`.
    """
    total = config.total_steps if num_steps is None else num_steps
    if not 0 <= total <= config.total_steps:
        raise ValueError(f"num_steps must be in 0..{config.total_steps} for this schedule, got {num_steps}")
    if isinstance(config, LadderConfig):
        if total != config.total_steps:
            raise ValueError("a noise ladder runs whole: num_steps must be left out")
        return ChainEnd(run_ladder(energy, x, config, generator, labels, on_step=on_step), None, total)
    step_fn = SAMPLERS.get(config.method)
    schedule = [config.steps] * config.rounds + ([config.final_steps] if config.final_steps else [])
    state: ChainState | None = None
    done = 0
    for round_index, steps_this_round in enumerate(schedule):
        if done == total:
            break
        if round_index < config.rounds and config.augment is not None:
            x = augment(state.x if state is not None else x, config.augment, generator)
            state = None
        count = min(steps_this_round, total - done)
        if count == 0:
            continue
        if state is None:
            state = evaluate(energy, x, labels, config.precision)
        # nobody reads the last position's energy: leave it unevaluated (a caller that goes on from here, as the
        # trainer's `differentiable_last_step`, evaluates it once, with what it needs)
        leave_last = done + count == total and on_step is None and config.method == "langevin"
        state, done = transitions(step_fn, energy, state, config, generator, labels, count - leave_last, on_step, done)
        if leave_last:
            return ChainEnd(langevin_move(energy, state, config, generator), None, done + 1)
    return ChainEnd(state.x if state is not None else x, state, done)


def _record(info: StepInfo, energies: list, grad_norms: list, accepts: list) -> None:
    energies.append(info.energy.detach())
    grad_norms.append(info.grad_norm.detach())
    if info.accepted is not None:
        accepts.append(info.accepted.float().mean())
