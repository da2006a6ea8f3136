"""The sampling pipeline: the one place that decides how an expression is sampled, once (`plan`), then runs it (`run`).

`Energy.sample`, `composable_ebm.sample`, ``cebm sample`` / ``cebm compose`` and the studio all call `sample`
here, so the same expression and seed give the same samples everywhere. It decides three things, and the
layers below it decide none of them:

- **the form** (`plan`): ``auto`` samples a sum of two or more conditioned models that all have a trained null
  condition (label dropout) in its guided form ``E_0 + sum_i s_i w_i (E_i(x | c_i) - E_i(x | 0))``, with each
  model's own guidance scale ``s_i``, and so one conditioned model whose defaults ask for it
  (``SamplingDefaults.guided_alone``: classifier-free guidance), a weight or temperature on it scaling its guidance
  (`weighted_alone`); anything else as written. ``plain`` samples as written; ``guided`` asks for the guided form
  (one line naming a term that has none). In every form a disjunction is a mixture
  (`composable_ebm.energy.branches`): each chain draws one branch with probability its share, and the branch is
  sampled in the form, with the settings of the first branch. A plain sum of models trained with label dropout
  warns that its guided form is the one that composes, and one that negates such a model is refused in one line
  (its plain difference also rewards what the model finds unlikely in general);
- **the chain** (`default_settings`): a trained model's own (`SamplingDefaults`, from its ``config.json``;
  on its own, with its ``alone`` settings), a composite's derived from its parts (below), else its family's default:
  a `LadderConfig` for a noise-conditioned energy, `UNDECLARED` (``exp(-E)`` itself, by MALA with an adapted step)
  for any other; keyword overrides of the chain's fields win, and a field of the other family's chain is one line;
- **the generator**: ``seed=`` or ``generator=``; without either, torch's global generator seeds the chains, so
  ``torch.manual_seed`` makes a call repeat.

A composite's settings come from its first part that has any, with these rules:

- a plain sum divides the step size by the number of terms (the authors' composition scripts), not by the
  weights, so a temperature ``/ T`` scales the gradient against fixed noise;
- a guided sum keeps the part's step size and steps: each term's guidance moves the chain as far as that model
  moves it alone, over the chain its model was trained on;
- augmentation transitions only when every part uses the same one and records (``augment_preserves``) that it
  leaves the attributes the part is bound to unchanged;
- a noise ladder keeps to the levels every noise-conditioned part was trained on (`trained_levels`): a part's ladder
  that starts above another part's highest level starts at that level instead, so no model is run where it never
  learned, and the order of the terms does not change the levels' range. A ladder given by hand that leaves them
  is sampled as given, with a warning naming the model.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from composable_ebm.energy import (Conditioned, Disjunction, Energy, Guided, NoiseConditioned, WeightedSum, branches,
                                   guided, mixture)
from composable_ebm.errors import InvalidInputError
from composable_ebm.sampling import (Chain, LadderConfig, SampleResult, SamplerConfig, SamplerDiagnostics,
                                     SamplingDefaults, make_generator, with_overrides)
from composable_ebm.sampling import sample as run_sampler
from composable_ebm.sampling.runner import check_count

Form = Literal["auto", "plain", "guided"]
FORMS: tuple[str, ...] = get_args(Form)


def model_defaults(energy: Energy) -> SamplingDefaults | None:
    """A trained model's own sampling defaults (its ``config.json``, `Energy.sampling_defaults`), ``None`` for an
    energy without any."""
    return energy.sampling_defaults


def _term_defaults(term: Energy) -> SamplingDefaults | None:
    """The sampling defaults of a conditioned model's term: its model's own, None without (or for a term that is no
    conditioned model)."""
    return model_defaults(term.base) if isinstance(term, Conditioned) else None


def guidance_scale(term: Energy) -> float:
    """The guidance scale of a conditioned model's term: its model's own, 1 without defaults (or for a term that is
    no conditioned model, which `Guided` then refuses by name)."""
    defaults = _term_defaults(term)
    return defaults.guidance_scale if defaults is not None else 1.0


def guidance_interval(term: Energy) -> tuple[float, float] | None:
    """The noise levels at which a conditioned model's guidance scale applies: its model's own, None (every level)
    without defaults."""
    defaults = _term_defaults(term)
    return defaults.guidance_interval if defaults is not None else None


def has_guided_form(energy: Energy) -> bool:
    """Whether ``form="auto"`` samples ``energy`` in its guided form: a sum of two or more conditioned models that all
    have a trained null condition, or one such model whose defaults say ``guided_alone``."""
    if isinstance(energy, Conditioned):
        defaults = model_defaults(energy.base)
        return energy.base.has_null_condition and defaults is not None and defaults.guided_alone
    return isinstance(energy, WeightedSum) and len(energy.terms) > 1 and all(
        isinstance(t, Conditioned) and t.base.has_null_condition for t in energy.terms)


def weighted_alone(energy: Energy) -> bool:
    """Whether ``energy`` is a positive weight or a temperature on one model drawn guided on its own (``2 * a``,
    ``a / T``): its guided form scales that model's guidance, as a weight does in a guided sum."""
    return (isinstance(energy, WeightedSum) and len(energy.terms) == 1 and energy.weights[0] > 0
            and has_guided_form(energy.terms[0]))


def composed(energy: Energy, form: str = "auto") -> Energy:
    """The energy the sampler runs for ``energy`` in ``form`` (one of `FORMS`); see the module's docstring."""
    if not isinstance(form, str) or form not in FORMS:
        raise InvalidInputError(f"unknown composition form {form!r}; valid choices: {list(FORMS)}")
    if isinstance(energy, Disjunction) or len(branches(energy)) > 1:  # a mixture: each branch in the form
        return mixture(energy, lambda branch: composed(branch, form))
    if isinstance(energy, Guided) or form == "plain":
        return energy
    if form == "auto" and not has_guided_form(energy) and not weighted_alone(energy):
        return energy
    return guided(energy, guidance_scale, guidance_interval)


def default_settings(energy: Energy) -> SamplingDefaults | None:
    """The settings ``sample`` uses for ``energy`` when none are given, ``None`` when no part has any (the
    sampler's defaults apply); see the module's docstring for the rules of composites. A model sampled on its own
    (`sampled_alone`) runs its `SamplingDefaults.alone_sampler`."""
    return _settings(energy, sampled_alone(energy))


def sampled_alone(energy: Energy) -> bool:
    """Whether ``energy`` is one trained model on its own: the model, one condition of it, or a sum or guided form
    of that one term."""
    while isinstance(energy, (WeightedSum, Guided)) and len(energy.terms) == 1:
        energy = energy.terms[0]
    if isinstance(energy, Conditioned):
        energy = energy.base
    return model_defaults(energy) is not None


def _settings(energy: Energy, alone: bool) -> SamplingDefaults | None:
    own = model_defaults(energy)
    if own is not None:
        return dataclasses.replace(own, sampler=own.alone_sampler()) if alone else own
    if isinstance(energy, Conditioned):
        return _settings(energy.base, alone)
    if not isinstance(energy, (WeightedSum, Disjunction, Guided)):
        return None
    parts = [_settings(t, alone) for t in energy.terms]
    first = next((d for d in parts if d is not None), None)
    if first is None:
        return None
    sampler = first.sampler
    if sampler.augment is not None:  # kept only where every part runs it and it keeps what each term is bound to
        augments = {d.sampler.augment if d is not None else None for d in parts}
        keeps = len(augments) == 1 and all(_preserves(t, d) for t, d in zip(energy.terms, parts, strict=True))
        sampler = sampler if keeps else dataclasses.replace(sampler, augment=None)
    if isinstance(energy, WeightedSum):
        sampler = dataclasses.replace(sampler, step_size=sampler.step_size / len(energy.terms))
    return SamplingDefaults(sampler)


def trained_levels(energy: Energy) -> tuple[float, float] | None:
    """The noise levels every noise-conditioned model in ``energy`` was trained on: the overlap of their
    ``noise_range`` (lowest, highest), None when none states one. Models trained on levels that do not overlap are
    one line: no ladder runs all of them where they learned."""
    ranges = _noise_ranges(energy)
    if not ranges:
        return None
    low, high = max(lo for lo, _ in ranges.values()), min(hi for _, hi in ranges.values())
    if low > high:
        listed = ", ".join(f"{part.name} [{lo:g}, {hi:g}]" for part, (lo, hi) in ranges.items())
        raise InvalidInputError(f"{energy.expression()} composes models trained on noise levels that do not overlap"
                                f" ({listed}); valid choices: compose models whose noise ranges overlap")
    return low, high


def _noise_ranges(energy: Energy) -> dict[Energy, tuple[float, float]]:
    """Each noise-conditioned model in ``energy`` that states the levels it was trained on, with them."""
    out = {}
    for part in leaves(energy):
        found = part.noise_range if isinstance(part, NoiseConditioned) else None
        if found is not None:
            out[part] = (float(found[0]), float(found[1]))
    return out


def _warn_outside(energy: Energy, config: Chain) -> None:
    """Warn when ``config`` walks noise levels some model in ``energy`` was not trained on."""
    span = config.noise_span()
    if span is None:
        return
    bottom, top = span
    for part, (low, high) in _noise_ranges(energy).items():
        if top > high * (1 + 1e-6) or bottom < low * (1 - 1e-6):
            warnings.warn(f"the noise ladder [{bottom:g}, {top:g}] reaches levels {part.name} was not trained on"
                          f" ([{low:g}, {high:g}]); its energy there is an extrapolation", stacklevel=4)


def _preserves(term: Energy, defaults: SamplingDefaults | None) -> bool:
    """Whether ``term``'s own augmentation is recorded to leave every attribute it is bound to unchanged."""
    bound = set(term.bound) if isinstance(term, Conditioned) else set()
    kept = defaults.augment_preserves if defaults is not None else None
    return not bound or (kept is not None and bound <= set(kept))


@dataclass(frozen=True)
class Plan:
    """What `run` runs: the energy in its form and the chain, every default and override decided."""

    energy: Energy
    config: Chain


def plan(energy: Energy, form: str = "auto", config: Chain | None = None, **overrides: Any) -> Plan:
    """Decide, once, how ``energy`` is sampled in ``form``: the energy in its form (`composed`), the chain (``config``,
    else its own settings or its family's default, kept to the levels its models were trained on), then
    ``overrides`` of the chain's fields. `sample` runs the plan; the studio and ``cebm compose`` show it first."""
    if not isinstance(energy, Energy):
        raise InvalidInputError(f"can only sample an Energy, got {type(energy).__name__}")
    _check_one_family(energy)
    levels = trained_levels(energy)
    runs = composed(energy, form)
    if form == "plain":
        _check_plain_negation(energy)
    if form == "plain" and any(isinstance(b, WeightedSum) and has_guided_form(b) for _, b in branches(energy)):
        warnings.warn(f"sampling {energy.expression()} in the plain form: its models were trained with a null"
                      " condition (label dropout), and their plain sums measured far less accurate than the guided"
                      " form (docs/benchmarks.md); form 'auto' samples it guided", stacklevel=3)
    parts = list(runs.terms) if isinstance(runs, Disjunction) else [runs]
    for part in parts:
        _check_floor(part)
        if constant(energy) or constant(part):
            raise InvalidInputError(f"{energy.expression()} has zero total weight on every term, so its energy is"
                                    " constant and its samples would be noise; give some term a non-zero weight")
    if config is None:  # a mixture's: its first branch's, within every branch's levels
        defaults = default_settings(parts[0])
        config = (defaults.sampler if defaults is not None else _family_default(parts[0])).within(levels)
    _check_family(config, overrides)
    config = with_overrides(config, overrides)
    _warn_outside(runs, config)
    return Plan(runs, config)


def _family_default(energy: Energy) -> Chain:
    """The chain of an energy none of whose parts declares settings: a `LadderConfig` for a noise-conditioned energy,
    else `UNDECLARED`, which samples exp(-E) itself."""
    return LadderConfig() if energy.noise_conditioned else UNDECLARED


UNDECLARED = SamplerConfig(method="mala", noise="exact", step_size=0.1, steps=400, adapt=200, clamp=True)
"""The chain of an energy that declares no sampling settings: MALA with exact noise, whose step size is adapted over
its first 200 transitions towards an acceptance of `SamplerConfig.target_acceptance`, so its samples come from
``exp(-E)`` (restricted to the value range) whatever the energy's scale. The image models declare their own."""


def sample(energy: Energy, n: int | None = None, config: Chain | None = None, *, form: str = "auto",
           **run_options: Any) -> SampleResult:
    """Sample ``energy`` as the toolkit does everywhere: `plan` (form and settings: ``config`` and the ``run_options``
    that name its fields), then `run`. The other ``run_options`` are `run`'s (``x0``, ``labels``, ``seed``,
    ``generator``, ``device``, ``keep_every``, ``progress``, ``callback``, ``speed``)."""
    overrides = {k: v for k, v in run_options.items() if k not in RUN_OPTIONS}
    return run(plan(energy, form, config, **overrides), n, **{k: v for k, v in run_options.items() if k in RUN_OPTIONS})


RUN_OPTIONS = ("x0", "labels", "seed", "generator", "device", "keep_every", "progress", "callback", "speed")
"""`run`'s own options; any other keyword of `sample` names a field of the chain."""


def run(chosen: Plan, n: int | None = None, *, x0: Tensor | None = None, labels: Any = None, seed: int | None = None,
        generator: torch.Generator | None = None, device: torch.device | str | None = None, keep_every: int = 0,
        progress: bool = False, callback: Any = None, speed: Any = None) -> SampleResult:
    """Run a `plan`: its chain on its energy (`composable_ebm.sampling.sample`), a mixture branch by branch; a latent
    energy's samples (and kept states) decoded once, at the end, by its latent space (`composable_ebm.latent`).

    A chain with an accept/reject step (MALA) that accepted no proposal at all is refused in one line: its samples
    would be the starting noise.
    """
    options = dict(x0=x0, labels=labels, seed=seed, generator=generator, device=device, keep_every=keep_every,
                   progress=progress, callback=callback, speed=speed)
    if isinstance(chosen.energy, Disjunction):
        result = _sample_mixture(chosen.energy, n, chosen.config, **options)
    else:
        result = run_sampler(chosen.energy, n, chosen.config, **options)
    acc = result.diagnostics.acceptance
    if acc is not None and acc.numel() and not bool(acc.any()):
        raise InvalidInputError(
            f"{chosen.config.method} accepted none of {acc.numel()} steps' proposals for {chosen.energy.expression()},"
            f" so the samples are the starting noise: its proposals ({chosen.config.summary()}) are too far for this"
            " energy; lower the step size" + (" or the noise" if "noise" in _fields(chosen.config) else ""))
    space = chosen.energy.latent_space
    if space is None:
        return result
    chain = None if result.chain is None else torch.stack([space.decode(frame) for frame in result.chain])
    return dataclasses.replace(result, samples=space.decode(result.samples), chain=chain, latents=result.samples)


def _fields(config: Chain | type) -> set[str]:
    return {f.name for f in dataclasses.fields(config)}


def _check_family(config: Chain, overrides: dict[str, Any]) -> None:
    """One line for overrides that are settings of the other family's chain only (``levels`` for a model without noise
    levels, ``rounds`` for a noise-conditioned one), naming both families."""
    other = SamplerConfig if config.noise_levels else LadderConfig
    theirs = sorted((set(overrides) - _fields(config)) & _fields(other))
    if theirs:
        whose = "models without noise levels" if config.noise_levels else "noise-conditioned models"
        raise InvalidInputError(f"{theirs} {'is a setting' if len(theirs) == 1 else 'are settings'} of {other.family},"
                                f" which {whose} sample with; this one samples with {config.family}: valid settings"
                                f" {sorted(_fields(config))}")


def _sample_mixture(energy: Disjunction, n: int | None, config: Chain, *, x0: Tensor | None, labels: Any,
                    seed: int | None, generator: torch.Generator | None, device: torch.device | str | None,
                    **run: Any) -> SampleResult:
    """A disjunction's samples: each chain draws its part from the parts' shares, then every part samples its chains
    with ``config`` from the same generator, in order. The samples (and kept states) stand in the chains' order; the
    per-step diagnostics are the parts' means weighted by their chains."""
    if x0 is not None and n is not None and n != x0.shape[0]:
        raise ValueError(f"n={n} disagrees with x0's batch of {x0.shape[0]}")
    count = check_count(n) if x0 is None else x0.shape[0]
    place = torch.device(device) if device is not None else (x0.device if x0 is not None else energy.device)
    gen = make_generator(seed, generator, place)
    shares = torch.tensor(energy.shares, dtype=torch.float64, device=gen.device)
    choice = torch.multinomial(shares, count, replacement=True, generator=gen).to(place)
    samples = chain = None
    pieces: list[tuple[int, SampleResult]] = []
    for k, part in enumerate(energy.terms):
        rows = (choice == k).nonzero().squeeze(1)
        if not rows.numel():
            continue
        given = {a: (v[rows] if isinstance(v, Tensor) and v.dim() > 0 else v) for a, v in (labels or {}).items()}
        result = run_sampler(part, None if x0 is not None else rows.numel(), config,
                             x0=None if x0 is None else x0[rows.to(x0.device)], labels=given or None,
                             generator=gen, device=place, **run)
        if samples is None:
            samples = result.samples.new_empty((count, *result.samples.shape[1:]))
            if result.chain is not None:
                chain = result.chain.new_empty((result.chain.shape[0], count, *result.chain.shape[2:]))
        samples[rows] = result.samples
        if chain is not None:
            chain[:, rows] = result.chain
        pieces.append((rows.numel(), result))

    def mean(field: str) -> Tensor | None:
        found = [(k, getattr(r.diagnostics, field)) for k, r in pieces]
        if any(v is None for _, v in found):
            return None
        return sum(k * v.float() for k, v in found) / count

    diagnostics = SamplerDiagnostics(energy=mean("energy"), grad_norm=mean("grad_norm"), acceptance=mean("acceptance"))
    return SampleResult(samples, chain, diagnostics, pieces[0][1].config)


def leaves(energy: Energy) -> list[Energy]:
    """The models an expression is made of (its algebra nodes unwrapped), in order."""
    if isinstance(energy, Conditioned):
        return leaves(energy.base)
    if isinstance(energy, (WeightedSum, Disjunction, Guided)):
        return [leaf for t in energy.terms for leaf in leaves(t)]
    return [energy]


def _check_one_family(energy: Energy) -> None:
    """Refuse a composite of noise-conditioned models and models of clean data: an annealed sampler would run the
    clean-data models on noised images, and a plain chain the noise-conditioned ones at their lowest level only."""
    parts = leaves(energy)
    noised = [p.name for p in parts if p.noise_conditioned]
    clean = [p.name for p in parts if not p.noise_conditioned]
    if noised and clean:
        raise InvalidInputError(
            f"{energy.expression()} mixes noise-conditioned models ({', '.join(noised)}) with models of clean data"
            f" ({', '.join(clean)}); valid choices: compose models of one family")


def tail_weight(energy: Energy) -> float:
    """How the energy grows far from the data, in units of one model's growth: a noise-conditioned model's energy
    grows like ``|x|^2 / (2 sigma^2)`` there (its denoiser's output stays bounded), so a plain sum grows by the sum of
    its weights (times its terms' own), a disjunction like its slowest part, and a guided form like its unconditional
    energy (the guidance differences cancel)."""
    if isinstance(energy, WeightedSum):
        return sum(w * tail_weight(t) for w, t in zip(energy.weights, energy.terms, strict=True))
    if isinstance(energy, Disjunction):
        return min(tail_weight(t) for t in energy.terms)
    return 1.0


def _check_plain_negation(energy: Energy) -> None:
    """Refuse a plain difference that negates a model trained with a null condition: ``-w E(x | b)`` also rewards
    what that model finds unlikely in general, so the plain form draws more of ``b``, not less (docs/algebra.md);
    its guided form negates only what the model says about ``b``."""
    for _, branch in branches(energy):
        if not isinstance(branch, WeightedSum):
            continue
        negated = [t for w, t in zip(branch.weights, branch.terms, strict=True)
                   if w < 0 and isinstance(t, Conditioned) and t.base.has_null_condition]
        if negated:
            raise InvalidInputError(
                f"{branch.expression()} negates {negated[0].expression()} in the plain form, where -E(x | b) also"
                " rewards what its model finds unlikely in general (off the data); valid choices: form 'auto' or"
                f" 'guided' (cebm compose's default, or guided(...)), which negates only what the model says about"
                " its condition")


def _check_floor(energy: Energy) -> None:
    """Refuse a noise-conditioned expression with no floor: a plain difference such as ``a - b`` falls without bound
    away from the data, and its chains end as noise. (A sum whose weights cancel on every term is `sample`'s own
    line.)"""
    if not energy.noise_conditioned or constant(energy):
        return
    tail = tail_weight(energy)
    if tail <= 1e-12:
        raise InvalidInputError(
            f"{energy.expression()} has no floor: its weights total {tail:g} far from the data, where each"
            " noise-conditioned model's energy grows like |x|^2 / (2 sigma^2), so its chains fall away and end as noise;"
            " valid choices: sample it guided (form 'auto' or 'guided', cebm compose's default, or guided(...)), or"
            " give the positive terms more weight than the negated ones")


def constant(energy: Energy) -> bool:
    """Whether ``energy`` is a sum whose weights cancel on every distinct term (``M - M``, ``0 * M``): as written its
    energy is constant (noise), and its guided form would be no term's condition at all."""
    if not isinstance(energy, (WeightedSum, Guided)):
        return False
    totals: dict[tuple, float] = {}
    for w, term in zip(energy.weights, energy.terms, strict=True):
        totals[_term_key(term)] = totals.get(_term_key(term), 0.0) + w
    return all(abs(w) < 1e-12 for w in totals.values())


def _term_key(term: Energy) -> tuple:
    """Terms with equal keys have equal energies: the same module, bound to the same values."""
    if isinstance(term, Conditioned) and not any(isinstance(v, Tensor) for v in term.bound.values()):
        return (id(term.base), tuple(sorted(term.bound.items())))
    return (id(term),)
