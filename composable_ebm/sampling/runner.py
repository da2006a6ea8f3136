"""The chain runner: Algorithm 2 of Du et al. 2021 ("EBM sampling algorithm").

Start from uniform noise (or a given batch), then ``rounds`` times: one augmentation
transition and ``steps`` Langevin (or MALA) steps; then ``final_steps`` plain steps.
The runner takes the energy per call and holds no model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from composable_ebm.energy import Energy, Labels
from composable_ebm.sampling.augment import augment
from composable_ebm.sampling.transitions import ChainState, SamplerConfig, StepInfo, evaluate, langevin_step, mala_step


@dataclass
class SamplerDiagnostics:
    """Per-step records, each of shape ``(total_steps,)``."""

    energy: Tensor  # mean energy after each step
    grad_norm: Tensor  # mean L2 norm of dE/dx at each step's start
    acceptance: Tensor | None  # MALA: fraction of chains accepted at each step; Langevin: None


@dataclass
class SampleResult:
    """What a sampler call returns; the fields do not depend on which options were set."""

    samples: Tensor  # (n, *input_shape), final states
    chain: Tensor | None  # (T, n, *input_shape): every keep_every-th state (first and last included), if asked
    diagnostics: SamplerDiagnostics
    config: SamplerConfig  # the settings actually used

    @property
    def acceptance_rate(self) -> float | None:
        """Mean MALA acceptance over all steps (``None`` for Langevin)."""
        acc = self.diagnostics.acceptance
        return None if acc is None or acc.numel() == 0 else float(acc.mean())


StepCallback = Callable[[dict[str, Any]], None]


def make_generator(seed: int | None, generator: torch.Generator | None, device: torch.device) -> torch.Generator:
    """An explicit generator on ``device``: the given one, or one seeded with ``seed`` (random if None)."""
    if generator is not None and seed is not None:
        raise ValueError("pass either seed= or generator=, not both")
    if generator is not None:
        if torch.device(generator.device).type != torch.device(device).type:
            raise ValueError(f"generator is on {generator.device} but the chains are on {device}")
        return generator
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen


def resolve_config(energy: Energy, config: SamplerConfig | None, overrides: dict[str, Any]) -> SamplerConfig:
    """The energy's default settings (or ``config``) with per-call overrides applied."""
    base = config or energy.sampler_config or SamplerConfig()
    if not overrides:
        return base
    valid = {f.name for f in dataclasses.fields(SamplerConfig)}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        raise ValueError(f"unknown sampler setting(s) {unknown}; valid settings: {sorted(valid)}")
    return dataclasses.replace(base, **overrides)


def initial_noise(energy: Energy, n: int, generator: torch.Generator, device: torch.device) -> Tensor:
    """Uniform noise over the value range (standard normal for unbounded energies)."""
    shape = (n, *energy.input_shape)
    if energy.value_range is None:
        return torch.randn(shape, generator=generator, device=device)
    lo, hi = energy.value_range
    return lo + (hi - lo) * torch.rand(shape, generator=generator, device=device)


def sample(
    energy: Energy,
    n: int | None = None,
    config: SamplerConfig | None = None,
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
    """Run Algorithm 2 on ``energy`` and return a :class:`SampleResult`.

    Args:
        energy: any ``Energy``, composite or not (it is not modified, nor its modes or flags).
        n: number of chains (with ``x0`` omitted: started from uniform noise).
        config: sampler settings; default: the energy's own (``energy.sampler_config``).
        x0: starting batch ``(n, *input_shape)`` instead of noise.
        labels: per-item attribute indices for a conditional energy.
        seed / generator: explicit randomness; the same seed gives the same samples.
        keep_every: keep every k-th state of the chain in ``result.chain`` (0: keep none).
        progress: show a progress bar.
        callback: called after every step with ``{"step", "x", "energy", "grad_norm", "accepted"}``.
        overrides: any :class:`SamplerConfig` field, e.g. ``steps=100``.
    """
    cfg = resolve_config(energy, config, overrides)
    if cfg.augment is not None and len(energy.input_shape) != 3:
        raise ValueError(f"augmentation transitions need image energies (C, H, W); this one takes {energy.input_shape}")
    if x0 is None:
        if n is None or n < 1:
            raise ValueError(f"n must be a positive number of samples, got {n}")
        dev = torch.device(device) if device is not None else energy.device
        gen = make_generator(seed, generator, dev)
        x = initial_noise(energy, n, gen, dev)
    else:
        if n is not None and n != x0.shape[0]:
            raise ValueError(f"n={n} disagrees with x0's batch of {x0.shape[0]}")
        x = x0.detach().to(torch.float32).clone()
        gen = make_generator(seed, generator, x.device)
    step_fn = mala_step if cfg.method == "mala" else langevin_step

    total = cfg.total_steps
    energies, grad_norms, accepts = [], [], []
    kept = [x.clone()] if keep_every > 0 else []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=f"sampling {energy.expression()}", leave=False)
    step = 0
    state: ChainState | None = None
    schedule = [cfg.steps] * cfg.rounds + ([cfg.final_steps] if cfg.final_steps else [])
    for round_index, steps_this_round in enumerate(schedule):
        if round_index < cfg.rounds and cfg.augment is not None:
            x = augment(state.x if state is not None else x, cfg.augment, gen)
            state = None
        if state is None:
            state = evaluate(energy, x, labels, cfg.precision)
        for _ in range(steps_this_round):
            state, info = step_fn(energy, state, cfg, gen, labels)
            step += 1
            _record(info, energies, grad_norms, accepts)
            if keep_every > 0 and (step % keep_every == 0 or step == total):
                kept.append(state.x.clone())
            if callback is not None:
                callback({"step": step, "x": state.x, "energy": info.energy, "grad_norm": info.grad_norm,
                          "accepted": info.accepted})
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    final = state.x if state is not None else x
    diagnostics = SamplerDiagnostics(
        energy=torch.stack(energies).float().cpu() if energies else torch.empty(0),
        grad_norm=torch.stack(grad_norms).float().cpu() if grad_norms else torch.empty(0),
        acceptance=(torch.stack(accepts).cpu() if accepts else torch.empty(0)) if cfg.method == "mala" else None,
    )
    chain = torch.stack(kept) if kept else None
    return SampleResult(final.detach(), chain, diagnostics, cfg)


def _record(info: StepInfo, energies: list, grad_norms: list, accepts: list) -> None:
    energies.append(info.energy.detach())
    grad_norms.append(info.grad_norm.detach())
    if info.accepted is not None:
        accepts.append(info.accepted.float().mean())
