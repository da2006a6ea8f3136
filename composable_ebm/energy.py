"""The energy contract and its algebra.

An `Energy` maps a batch ``(B, *input_shape)`` to energies ``(B,)``; lower
energy means more likely, ``p(x) ∝ exp(-E(x))``. Every algebra operation returns an
``Energy`` again, so a sampler never special-cases composites (Du et al. 2020,
"Compositional Visual Generation with Energy Based Models"):

- ``a + b``: conjunction (product of experts), ``E_a + E_b``;
- ``w * a``: weighting, any real ``w``; ``a - w * b``: negation relative to a base;
- ``a | b``: disjunction, ``-logsumexp(-E_a, -E_b)``, sampled as the mixture of its parts (`branches`);
- ``a / T``: temperature, ``E_a / T``;
- ``a.condition(attr=value)``: binds attributes of a conditional model.

A noise-conditioned energy ``E(x, sigma)`` (a model of the data blurred by Gaussian noise of std ``sigma`` at
every level of a ladder, trained by denoising score matching) lives in the same algebra: ``forward(x, labels,
sigma=...)`` passes the level through every node to every term, and an energy that does not depend on the level
ignores it. `noise_conditioned` says whether an expression has such a term.

An energy knows nothing of sampling: how an expression is sampled (its guided form, a model's own settings,
the generator) is decided in one place above it, `composable_ebm.pipeline`, which ``energy.sample(n)``
imports when it is called (the only import of a higher layer here). This module imports no sampler, and no
module-level state decides how an energy samples.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Real
from typing import Any

import torch
from torch import Tensor, nn

from composable_ebm.accel.labels import as_index, check_indices
from composable_ebm.configs import check_interval
from composable_ebm.errors import InvalidInputError, NotSavableError, quote

Labels = Mapping[str, Tensor]
"""Per-item attribute values: attribute name -> integer value indices of shape ``(B,)``
(`NULL` for an item whose attribute is left unbound)."""

MAX_WEIGHT = 1e6
"""Largest weight a composite's term may carry (a product of weights and inverse temperatures)."""

MAX_NESTING = 64
"""Deepest nesting of algebra nodes in one composite (a sum inside a disjunction inside a sum ...). Sums and
disjunctions flatten, so an expression within `composable_ebm.expression.MAX_DEPTH` stays far below it."""

NULL = -1
"""The value index of the null condition: the attribute is left unbound for that item, and a model
trained with label dropout gives its unconditional energy there."""

NoiseLevel = Tensor | float
"""A noise level ``sigma``: one number for the whole batch, or a tensor ``(B,)`` of one level per item."""


def noise_levels(sigma: NoiseLevel, batch_size: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``sigma`` as a ``(B,)`` tensor; a number must be finite and positive, a tensor of shape ``()`` or ``(B,)`` (its
    values are not read here, so a chain on a GPU never waits for them)."""
    if not isinstance(sigma, Tensor) and not (isinstance(sigma, Real) and math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"a noise level must be a finite positive number or a tensor, got {sigma!r}")
    level = (torch.as_tensor(sigma, device=device, dtype=dtype) if isinstance(sigma, Tensor)
             else torch.full((), float(sigma), device=device, dtype=dtype))  # a fill, no host-to-device copy
    if level.ndim == 0:
        level = level.expand(batch_size)
    if level.shape != (batch_size,):
        raise ValueError(f"a noise level must be a number or a tensor of shape ({batch_size},), got {tuple(level.shape)}")
    return level


class Energy(nn.Module):
    """Base class of every energy: networks, analytic energies and composites.

    Subclasses implement `energy`; `forward` checks shapes at the boundary. A subclass whose energy depends on a
    noise level sets ``takes_noise_level = True`` and implements ``energy(x, labels, sigma)``.

    Args:
        input_shape: shape of one input, e.g. ``(3, 32, 32)`` for images or ``(2,)``.
        value_range: ``(low, high)`` that samples are clamped to, ``None`` if unbounded.
        attributes: for conditional models, attribute name -> its value names.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        value_range: tuple[float, float] | None = (0.0, 1.0),
        attributes: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        super().__init__()
        self.input_shape: tuple[int, ...] = tuple(int(s) for s in input_shape)
        if value_range is not None:
            low, high = (float(v) for v in value_range)
            if not low < high:
                raise ValueError(f"value_range must satisfy low < high, got {value_range}")
            value_range = (low, high)
        self.value_range: tuple[float, float] | None = value_range
        self.attributes: dict[str, tuple[str, ...]] = {
            name: tuple(values) for name, values in (attributes or {}).items()
        }

    sampling_defaults: Any = None
    """A trained model's own sampling settings (`composable_ebm.sampling.SamplingDefaults`, from its ``config.json``
    or recipe), which the pipeline reads; None for an energy that declares none (the pipeline then samples
    ``exp(-E)`` itself: `composable_ebm.pipeline.UNDECLARED`). Algebra nodes declare none: a composite's settings
    come from its parts."""

    condition_weights: tuple[str, ...] = ()
    """Prefixes of the names of the weights that read only the condition, and that at zero leave the energy its
    unconditional one (a conditional U-Net's ``embed_condition.``). A fine-tune from a model without attributes
    (an unconditional base, ``cebm train --init``) starts them at zero, so it starts as the base's energy."""

    latent_space: Any = None
    """The autoencoder whose latents this energy is over (`composable_ebm.latent.LatentSpace`, given when its model is
    loaded); None for an energy over pixels or points. The pipeline decodes a latent energy's samples with it. A
    composite's is its parts' one latent space."""

    @property
    def latent_source(self) -> str | None:
        """The autoencoder this energy's model names (a bundled name, a Hub id or a folder), for the loader to give it
        its `latent_space`; None: it names none. A network over latents overrides this."""
        return None

    @property
    def latent_fingerprint(self) -> str | None:
        """The `composable_ebm.latent.fingerprint` of the autoencoder it was trained over, which the loader checks the
        one it finds against; None: not recorded. A network over latents overrides this."""
        return None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample as `sample` returns it: a decoded image for a latent energy, else ``input_shape``."""
        return tuple(self.latent_space.image_shape) if self.latent_space is not None else self.input_shape

    takes_noise_level: bool = False
    """Whether `energy` takes the noise level (``energy(x, labels, sigma)``): noise-conditioned networks and the
    algebra nodes, which pass it to their terms."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "forward" in cls.__dict__:
            raise TypeError(
                f"{cls.__name__} overrides forward(); Energy subclasses implement energy(x, labels) instead,"
                " so that forward() keeps checking input and output shapes"
            )

    # ------------------------------------------------------------------ contract
    @property
    def name(self) -> str:
        """Short name used in composite expressions."""
        return type(self).__name__

    def expression(self) -> str:
        """The algebraic expression this energy stands for (a leaf is its name)."""
        return self.name

    @property
    def device(self) -> torch.device:
        """Device of the first parameter or buffer; the CPU for an energy that holds no tensors."""
        for t in itertools.chain(self.parameters(), self.buffers()):
            return t.device
        return torch.device("cpu")

    @property
    def noise_conditioned(self) -> bool:
        """Whether this energy (or, for a composite, any of its terms) depends on the noise level."""
        return self.takes_noise_level

    def energy(self, x: Tensor, labels: Labels | None) -> Tensor:
        """Energies ``(B,)`` of a batch ``x`` of shape ``(B, *input_shape)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement energy(x, labels)")

    def forward(self, x: Tensor, labels: Labels | None = None, sigma: NoiseLevel | None = None) -> Tensor:
        """Energies of shape ``(B,)``; raises ``ValueError`` on a wrong input or output shape.

        ``sigma`` is the noise level for noise-conditioned terms (one number, or ``(B,)``); an energy that does not
        depend on it ignores it, and a noise-conditioned network without it uses its lowest trained level."""
        self._check_batch(x)
        if labels:
            labels = self.encode_labels(labels, batch_size=x.shape[0], device=x.device)
        if sigma is not None:
            sigma = noise_levels(sigma, x.shape[0], x.device, x.dtype if x.is_floating_point() else torch.float32)
        if self.takes_noise_level:
            out = self.energy(x, labels or None, sigma)
        else:
            out = self.energy(x, labels or None)
        if out.shape != (x.shape[0],):
            raise ValueError(
                f"{self.expression()} must return energies of shape ({x.shape[0]},) for a batch of"
                f" {x.shape[0]}, got {tuple(out.shape)}"
            )
        return out

    def _check_batch(self, x: Tensor) -> None:
        """Raise ``ValueError`` unless ``x`` is a batch of this energy's input shape."""
        if tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(
                f"{self.expression()} expects a batch of shape (B, {', '.join(map(str, self.input_shape))}),"
                f" got {tuple(x.shape)}"
            )

    def conditioned_and_null(self, x: Tensor, labels: dict[str, Tensor],
                             sigma: NoiseLevel | None = None) -> tuple[Tensor, Tensor]:
        """``E(x | labels)`` and ``E(x | 0)`` (every attribute unbound), each ``(B,)``, for guided composition,
        at noise level ``sigma`` for a noise-conditioned model.

        One call on a batch of ``2B``; a network whose condition enters after layers both share overrides
        it to run those layers once.
        """
        b = x.shape[0]
        codes = {attr: torch.cat([idx, torch.full_like(idx, NULL)]) for attr, idx in labels.items()}
        if sigma is not None:
            level = noise_levels(sigma, b, x.device, x.dtype)
            sigma = torch.cat([level, level])
        cond, null = self(torch.cat([x, x]), codes, sigma=sigma).split(b)
        return cond, null

    def energy_and_grad(
        self, x: Tensor, labels: Labels | None = None, create_graph: bool = False, sigma: NoiseLevel | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Energies ``(B,)`` and ``dE/dx`` (shape of ``x``); never touches parameter ``.grad``.

        With ``create_graph=True`` the gradient stays differentiable with respect to the
        parameters (used by the KL loss through the last Langevin step); ``x`` is then used
        as given, so a caller may keep its own graph through it.
        """
        with torch.enable_grad():
            if not create_graph or not x.requires_grad:
                x = x.detach().requires_grad_(True)
            e = self(x, labels, sigma=sigma)
            (grad,) = torch.autograd.grad(e.sum(), x, create_graph=create_graph)
        return (e if create_graph else e.detach()), grad

    def score(self, x: Tensor, labels: Labels | None = None, sigma: NoiseLevel | None = None) -> Tensor:
        """The score ``-dE/dx`` (shape of ``x``), without touching parameter gradients."""
        return -self.energy_and_grad(x, labels, sigma=sigma)[1]

    # ------------------------------------------------------------- conditioning
    def encode_labels(self, labels: Labels, batch_size: int, device: torch.device) -> dict[str, Tensor]:
        """Check attribute names and value indices; broadcast scalars to ``(B,)`` long tensors."""
        out: dict[str, Tensor] = {}
        for attr, value in labels.items():
            values = self._check_attribute(attr)
            index = as_index(value, device)
            idx = index.expand(batch_size) if index.ndim == 0 else index
            if idx.shape != (batch_size,):
                raise ValueError(
                    f"labels[{attr!r}] must be a scalar or have shape ({batch_size},), got {tuple(idx.shape)}"
                )
            check_indices(attr, values, value, index, idx, NULL)  # in range, read back once per labels tensor
            out[attr] = idx
        return out

    def _check_attribute(self, attr: str) -> tuple[str, ...]:
        bound = getattr(self, "bound", {})
        if attr in bound:
            raise ValueError(f"attribute {attr!r} is already bound in {self.expression()}; condition the unbound model"
                             f" instead" + (f" (unbound attributes: {sorted(self.attributes)})" if self.attributes else ""))
        if not self.attributes:
            raise ValueError(f"{self.expression()} is not conditional: it has no attributes to bind (got {attr!r})")
        if attr not in self.attributes:
            raise ValueError(
                f"{self.expression()} has no attribute {attr!r}; valid attributes: {sorted(self.attributes)}"
            )
        return self.attributes[attr]

    def condition(self, **values: str | int | Tensor) -> Energy:
        """Bind attribute values, e.g. ``model.condition(color="red")``.

        A value is a value name, an index, or a tensor of indices ``(B,)`` (per batch item,
        for training). Returns an ``Energy`` whose remaining attributes are the unbound ones.
        """
        if not values:
            raise ValueError(f"condition() needs at least one attribute; valid attributes: {sorted(self.attributes)}")
        bound: dict[str, int | Tensor] = {}
        for attr, value in values.items():
            self._check_attribute(attr)
            if isinstance(value, Tensor):
                if value.dtype.is_floating_point or value.ndim > 1:
                    raise ValueError(f"per-item values of {attr!r} must be an integer tensor of shape (B,)")
                bound[attr] = value
            else:
                bound[attr] = value_index(self.attributes, attr, value)
        return Conditioned(self, bound)

    @property
    def has_null_condition(self) -> bool:
        """Whether an unbound attribute gives a trained unconditional energy (label dropout); an
        energy with no attributes is its own unconditional energy."""
        return not self.attributes

    # ---------------------------------------------------------------- sampling
    def sample(self, n: int, **kwargs: Any) -> Tensor:
        """Draw ``n`` samples ``(n, *input_shape)``: `composable_ebm.pipeline.sample` (Algorithm 2, in the guided
        form for a sum of conditioned models, with the models' own settings); ``seed=`` makes it repeat."""
        return self.sample_result(n, **kwargs).samples

    def sample_result(self, n: int, **kwargs: Any) -> Any:
        """Like `sample` but returns the whole `composable_ebm.sampling.SampleResult`: the samples, the kept chain,
        the per-step diagnostics and the settings used."""
        # The one import of a higher layer in this module, made when a sample is asked for: the pipeline decides how
        # an energy is sampled and imports this module, so this module cannot import it at the top.
        from composable_ebm.pipeline import sample

        return sample(self, n, **kwargs)

    # ----------------------------------------------------------------- algebra
    def __add__(self, other: object) -> Energy:
        if isinstance(other, Energy):
            return WeightedSum.combine([(1.0, self), (1.0, other)])
        if isinstance(other, Real) and other == 0:  # lets sum([...]) start from 0
            return self
        return NotImplemented

    __radd__ = __add__

    def __sub__(self, other: object) -> Energy:
        if isinstance(other, Energy):
            return WeightedSum.combine([(1.0, self), (-1.0, other)])
        return NotImplemented

    def __neg__(self) -> Energy:
        return WeightedSum.combine([(-1.0, self)])

    def __mul__(self, weight: object) -> Energy:
        if isinstance(weight, Tensor):
            raise TypeError(f"energy weights are Python numbers (e.g. float(w) * energy), got a tensor of shape"
                            f" {tuple(weight.shape)}")
        if isinstance(weight, Real) and not isinstance(weight, bool):
            if not math.isfinite(float(weight)):
                raise ValueError(f"energy weights must be finite, got {weight}")
            return WeightedSum.combine([(float(weight), self)])
        return NotImplemented

    __rmul__ = __mul__

    def __truediv__(self, temperature: object) -> Energy:
        if isinstance(temperature, Tensor):
            raise TypeError("temperatures are Python numbers (e.g. energy / float(t)), got a tensor")
        if isinstance(temperature, Real) and not isinstance(temperature, bool):
            if not (math.isfinite(float(temperature)) and float(temperature) > 0):
                raise ValueError(f"temperature must be a finite positive number, got {temperature}")
            return WeightedSum.combine([(1.0 / float(temperature), self)])
        return NotImplemented

    def __or__(self, other: object) -> Energy:
        if isinstance(other, Energy):
            return Disjunction([self, other])
        return NotImplemented


class NoiseConditioned(Energy):
    """A noise-conditioned energy ``E(x, sigma)``: a model of the data blurred by Gaussian noise of std ``sigma`` at
    every level (Song & Ermon 2019), which implements ``energy(x, labels, sigma)`` and declares its levels, as EDM's
    ``EDMPrecond`` states ``sigma_min``, ``sigma_max`` and ``sigma_data`` (Karras et al. 2022). The pipeline, the noise
    ladder and the denoising objective ask this type for them; a composite of such energies is not one itself (its
    terms are, `Energy.noise_conditioned`)."""

    takes_noise_level = True

    @property
    def noise_range(self) -> tuple[float, float] | None:
        """``(sigma_min, sigma_max)``: the lowest and highest levels it was trained on, ``None`` for an energy that is
        exact at every level (an analytic one)."""
        return None

    @property
    def sigma_data(self) -> float | None:
        """The standard deviation of the data its preconditioning assumes, ``None`` for one that assumes none."""
        return None


def value_index(attributes: Mapping[str, Sequence[str]], attr: str, value: str | int) -> int:
    """The index of ``value`` (a value name or an index) of attribute ``attr``; a ``ValueError`` lists
    the valid attributes or values otherwise."""
    if attr not in attributes:
        raise InvalidInputError(f"no attribute {attr!r}; valid attributes: {sorted(attributes)}")
    names = list(attributes[attr])
    if isinstance(value, str):
        if value not in names:
            raise InvalidInputError(f"attribute {attr!r} has no value {value!r}; valid values: {names}")
        return names.index(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < len(names):
            raise InvalidInputError(f"attribute {attr!r} index {value} is out of range; valid values: {names}")
        return value
    raise InvalidInputError(f"value of {attr!r} must be a value name or an index, got {value!r}; valid values: {names}")


def nesting(energy: Energy) -> int:
    """How many algebra nodes deep ``energy`` is: 0 for a model, one more than its deepest part for a node."""
    return getattr(energy, "_nesting", 0)


def _check_nesting(parts: Sequence[Energy]) -> int:
    """The nesting of a node made of ``parts``; one line past `MAX_NESTING` (a deeper tree would exhaust Python's
    recursion wherever it is walked)."""
    depth = 1 + max(nesting(p) for p in parts)
    if depth > MAX_NESTING:
        raise InvalidInputError(f"a composite nests {depth} algebra nodes deep; at most {MAX_NESTING} (sums and"
                                " disjunctions flatten: build wide, not deep)")
    return depth


def _check_compatible(parts: Sequence[Energy]) -> tuple[tuple[int, ...], tuple[float, float] | None]:
    first = parts[0]
    for other in parts[1:]:
        _check_same_space(first, other)
        if other.input_shape != first.input_shape:
            raise ValueError(
                f"cannot compose energies with different input shapes: {first.expression()} expects"
                f" {first.input_shape}, {other.expression()} expects {other.input_shape}"
            )
        if other.value_range != first.value_range:
            raise ValueError(
                f"cannot compose energies with different value ranges: {first.expression()} has"
                f" {first.value_range}, {other.expression()} has {other.value_range}"
            )
    return first.input_shape, first.value_range


def _check_same_space(first: Energy, other: Energy) -> None:
    """One line when two energies are not over the same space: the latents of two autoencoders, or latents and
    pixels (a sum there would add energies of different things)."""
    a, b = first.latent_space, other.latent_space
    if a == b:
        return
    if a is not None and b is not None:
        raise ValueError(f"cannot compose energies over different autoencoders' latents: {first.expression()} is over"
                         f" the latents of {a}, {other.expression()} over those of {b}; compose models that share one"
                         " autoencoder")
    latent, pixel = (first, other) if a is not None else (other, first)
    raise ValueError(f"cannot compose a latent energy with one over pixels: {latent.expression()} is over the latents"
                     f" of {latent.latent_space}, {pixel.expression()} over pixels; compose models of one kind")


class _Composite(Energy):
    """An algebra node: made of other energies, never saved itself. Asked for ``save_pretrained`` or
    ``push_to_hub``, it says why it has none (only these nodes pay for the lookup, not the networks' layers).
    It passes the noise level to every term."""

    takes_noise_level = True

    def __init__(self, parts: Sequence[Energy], input_shape: Sequence[int], value_range: tuple[float, float] | None,
                 attributes: Mapping[str, Sequence[str]] | None = None) -> None:
        depth = _check_nesting(parts)  # before any module is built: a tree too deep is one line
        super().__init__(input_shape, value_range, attributes)
        self._nesting = depth
        self.latent_space = parts[0].latent_space  # the parts' one space (`_check_compatible`)

    @property
    def noise_conditioned(self) -> bool:
        """Whether any term depends on the noise level."""
        parts = self.terms if hasattr(self, "terms") else [self.base]
        return any(t.noise_conditioned for t in parts)

    def __getattr__(self, name: str) -> Any:
        if name in ("save_pretrained", "push_to_hub"):
            raise NotSavableError(f"a {type(self).__name__} has no {name}: only a trained model (cebm.load, a network"
                                  " class) is saved or pushed; save each model a composite is made of")
        return super().__getattr__(name)


def _format_weight(w: float) -> str:
    return repr(float(w))


class WeightedSum(_Composite):
    """``sum_i w_i * E_i``: conjunction, weighting, negation and temperature in one node.

    Build it with the operators; `combine` flattens nested sums, so
    ``(a + b) + 2 * (c - d)`` is one node with four terms.
    """

    def __init__(self, weights: Sequence[float], terms: Sequence[Energy]) -> None:
        if len(weights) != len(terms) or not terms:
            raise ValueError("WeightedSum needs one weight per term and at least one term")
        input_shape, value_range = _check_compatible(terms)
        super().__init__(terms, input_shape, value_range)
        self.weights: tuple[float, ...] = tuple(float(w) for w in weights)
        self.terms = nn.ModuleList(terms)

    @classmethod
    def combine(cls, weighted: Sequence[tuple[float, Energy]]) -> WeightedSum:
        """A flat weighted sum of the given ``(weight, energy)`` pairs; a weight that overflows (``M * 2 * 2 ...``,
        ``M / 1e-200 / 1e-200``) is one line naming it."""
        weights: list[float] = []
        terms: list[Energy] = []
        for w, e in weighted:
            if isinstance(e, WeightedSum):
                weights.extend(w * inner for inner in e.weights)
                terms.extend(e.terms)
            else:
                weights.append(w)
                terms.append(e)
        big = [w for w in weights if not math.isfinite(w) or abs(w) > MAX_WEIGHT]
        if big:
            raise InvalidInputError(f"a weight of the composite reached {big[0]:g}; weights (temperatures' inverses"
                                    f" included) must stay within +-{MAX_WEIGHT:g}")
        return cls(weights, terms)

    @property
    def num_models(self) -> int:
        """Number of summed energies."""
        return len(self.terms)

    @property
    def total_weight(self) -> float:
        """``sum_i |w_i|``: the gradient of the sum is up to this many times a part's gradient."""
        return sum(abs(w) for w in self.weights)

    def energy(self, x: Tensor, labels: Labels | None, sigma: Tensor | None = None) -> Tensor:
        """``sum_i w_i * E_i(x)``, ``(B,)``."""
        total = self.weights[0] * self.terms[0](x, sigma=sigma)
        for w, term in zip(self.weights[1:], self.terms[1:], strict=True):
            total = total + w * term(x, sigma=sigma)
        return total

    def expression(self) -> str:
        """The sum as text, e.g. ``(color[red] + 2.0 * shape[circle])``."""
        parts = []
        for i, (w, term) in enumerate(zip(self.weights, self.terms, strict=True)):
            sign = "-" if w < 0 else "+"
            mag = abs(w)
            body = term.expression() if mag == 1.0 else f"{_format_weight(mag)} * {term.expression()}"
            if i == 0:
                parts.append(body if sign == "+" else f"-{body}")
            else:
                parts.append(f" {sign} {body}")
        return "(" + "".join(parts) + ")"

    def __repr__(self) -> str:
        return self.expression()


class Disjunction(_Composite):
    """``a | b``: the mixture of its parts. Its energy is ``-logsumexp_i(-E_i + log w_i)``, the mixture of the parts'
    unnormalised densities with weights ``w_i`` (1 each unless given: `either`); the pipeline samples it as the
    mixture of the parts' normalised distributions, each chain drawn from one part chosen with probability
    ``w_i / sum_j w_j`` (`branches`), so the shares follow the weights and not the parts' normalisers, which training
    does not fix. Nested disjunctions flatten, a part's weight multiplying its own parts' (``(a | b) | c`` is one node
    of three parts, each weighted 1)."""

    def __init__(self, terms: Sequence[Energy], weights: Sequence[float] | None = None) -> None:
        weights = [1.0] * len(terms) if weights is None else [float(w) for w in weights]
        if len(weights) != len(terms) or not terms:
            raise ValueError("Disjunction needs one weight per part and at least one part")
        bad = [w for w in weights if not (math.isfinite(w) and 0 < w <= MAX_WEIGHT)]
        if bad:
            raise InvalidInputError(f"a disjunction's weight must be a positive number up to {MAX_WEIGHT:g} (a part's"
                                    f" share of the samples), got {bad[0]:g}")
        flat: list[Energy] = []
        flat_weights: list[float] = []
        for w, t in zip(weights, terms, strict=True):
            if isinstance(t, Disjunction):
                flat.extend(t.terms)
                flat_weights.extend(w * inner for inner in t.weights)
            else:
                flat.append(t)
                flat_weights.append(w)
        input_shape, value_range = _check_compatible(flat)
        super().__init__(flat, input_shape, value_range)
        self.terms = nn.ModuleList(flat)
        self.weights: tuple[float, ...] = tuple(flat_weights)
        """each part's weight: its share of the samples is its weight over their sum"""

    @property
    def shares(self) -> tuple[float, ...]:
        """Each part's share of the samples, ``w_i / sum_j w_j``."""
        total = sum(self.weights)
        return tuple(w / total for w in self.weights)

    def energy(self, x: Tensor, labels: Labels | None, sigma: Tensor | None = None) -> Tensor:
        """``-logsumexp_i(-E_i(x) + log w_i)``, ``(B,)``."""
        stacked = torch.stack([t(x, sigma=sigma) for t in self.terms], dim=1)  # (B, K)
        if any(w != 1.0 for w in self.weights):
            stacked = stacked - torch.tensor([math.log(w) for w in self.weights], dtype=stacked.dtype,
                                             device=stacked.device)
        return -torch.logsumexp(-stacked, dim=1)

    def expression(self) -> str:
        """The disjunction as text, e.g. ``(color[red] | color[blue])`` or ``(3 : color[red] | color[blue])``."""
        return "(" + " | ".join(t.expression() if w == 1.0 else f"{_format_weight(w)} : {t.expression()}"
                                for w, t in zip(self.weights, self.terms, strict=True)) + ")"

    def __repr__(self) -> str:
        return self.expression()


MAX_BRANCHES = 256
"""Most branches an expression's disjunctions multiply out to (`branches`)."""


def either(*parts: Energy, weights: Sequence[float] | None = None) -> Disjunction:
    """``a | b | ...`` with each part's share of the samples given: ``either(a, b, weights=[3, 1])`` draws ``a``
    three times as often as ``b``."""
    if not parts or not all(isinstance(p, Energy) for p in parts):
        raise InvalidInputError("either() takes energies, e.g. either(a, b, weights=[3, 1])")
    return Disjunction(list(parts), weights)


def branches(energy: Energy) -> list[tuple[float, Energy]]:
    """``energy`` as a mixture of expressions without a disjunction: ``(share, branch)`` pairs, the shares summing
    to 1. A sum distributes over its disjunctions (``s + (a | b)`` is ``(s + a) | (s + b)``, each half), a positive
    weight or a temperature over a disjunction's parts; a negated disjunction has no such form and is one line, as is
    an expression of more than `MAX_BRANCHES` branches (the line gives the count). An expression without a
    disjunction is its one branch."""
    if isinstance(energy, Disjunction):
        out = [(share * inner, branch) for share, part in zip(energy.shares, energy.terms, strict=True)
               for inner, branch in branches(part)]
        _check_branches(len(out))
    elif isinstance(energy, WeightedSum):
        parts = []
        for w, term in zip(energy.weights, energy.terms, strict=True):
            split = branches(term)
            if len(split) > 1 and w < 0:
                raise InvalidInputError(
                    f"{quote(energy.expression())} negates a disjunction ({quote(term.expression())}), which is no"
                    " mixture of branches; valid choices: negate each part (a - b - c), or name the values to keep")
            parts.append([(share, w, branch) for share, branch in split])
        if all(len(p) == 1 for p in parts):
            return [(1.0, energy)]
        _check_branches(math.prod(len(p) for p in parts))
        out = [(math.prod(c[0] for c in combination), WeightedSum.combine([(w, b) for _, w, b in combination]))
               for combination in itertools.product(*parts)]
    else:
        return [(1.0, energy)]
    return out


def _check_branches(count: int) -> None:
    if count > MAX_BRANCHES:
        raise InvalidInputError(f"the expression multiplies out to {count:,} branches (every choice of one part of each"
                                f" disjunction); at most {MAX_BRANCHES}: fewer or narrower disjunctions")


def mixture(energy: Energy, each: Callable[[Energy], Energy] = lambda e: e) -> Energy:
    """``energy`` with its disjunctions outermost: a `Disjunction` of its `branches`, ``each`` applied to every
    branch (weighted by its share, the least 1, or the largest where they span more than `MAX_WEIGHT`);
    ``each(energy)`` when it has none."""
    split = branches(energy)
    if len(split) == 1 and not isinstance(energy, Disjunction):
        return each(energy)
    least, most = min(share for share, _ in split), max(share for share, _ in split)
    scale = least if most / least <= MAX_WEIGHT else most  # shares too far apart: the largest is 1, the rest below
    return Disjunction([each(b) for _, b in split], [share / scale for share, _ in split])


class Conditioned(_Composite):
    """A conditional energy with some attributes bound (``model.condition(attr=value)``)."""

    def __init__(self, base: Energy, bound: Mapping[str, int | Tensor]) -> None:
        remaining = {k: v for k, v in base.attributes.items() if k not in bound}
        super().__init__([base], base.input_shape, base.value_range, remaining)
        self.base = base
        self.bound: dict[str, int | Tensor] = dict(bound)

    @property
    def name(self) -> str:
        return self.base.name

    def energy(self, x: Tensor, labels: Labels | None, sigma: Tensor | None = None) -> Tensor:
        """The base energy under the bound attribute values (and any others given in ``labels``)."""
        merged: dict[str, Any] = dict(labels or {})
        merged.update(self.bound)
        return self.base(x, merged, sigma=sigma)

    def expression(self) -> str:
        """The base's expression with its bound values, e.g. ``color[red]``."""
        shown = []
        for attr, v in self.bound.items():
            if isinstance(v, Tensor):
                shown.append(f"{attr}=<per-item>")
            else:
                value = self.base.attributes[attr][v]
                shown.append(value if len(self.bound) == 1 else f"{attr}={value}")
        return f"{self.base.expression()}[{', '.join(shown)}]"

    def __repr__(self) -> str:
        return self.expression()


class Guided(_Composite):
    """Guided conjunction: ``E_0(x) + sum_i w_i (E_i(x | c_i) - E_i(x | 0))``.

    Each term is a conditioned model ``E_i(x | c_i)`` whose null condition ``E_i(x | 0)`` was trained
    (label dropout); ``E_0`` is the mean of the terms' unconditional energies, every model's estimate
    of the data density at once, so the result does not depend on the order of the terms (the first
    term's alone would make it depend on which model comes first). For two terms with unit
    weights this is ``p(x | a, b) ∝ p(x | a) p(x | b) / p(x)``, the conjunction of independently
    trained conditionals (Liu et al. 2022, "Compositional Visual Generation with Composable
    Diffusion Models"; Du et al. 2023, "Reduce, Reuse, Recycle"); a negative weight is the
    negation ``E(x | a) - w (E(x | b) - E(x | 0))``. A plain sum ``E(x | a) + E(x | b)`` counts
    ``p(x)`` twice, and a weight amplifies a model's bias along with its attribute.

    Each term has a guidance scale, given when the node is built (1 by default), that multiplies its weight, as
    classifier-free guidance scales a model's pull: the pipeline passes each model's own scale
    (`composable_ebm.sampling.SamplingDefaults.guidance_scale`, which its card names), so the weights written in
    the expression are relative to it. The energy's value depends only on what the node was built with.

    A term may also have a guidance interval ``(lo, hi)``: its scale applies only at noise levels ``lo < sigma <=
    hi``, and elsewhere the term counts at scale 1 (its plain conditional, ``w_i (E_i(x | c_i) - E_i(x | 0))``).
    Guidance at the high noise levels, where a sample's coarse layout is decided, can pull what the condition does
    not name away from the data's mix under it; an interval of lower levels keeps the condition's pull where the
    condition's own detail is decided (Kynkäänniemi et al. 2024, "Applying Guidance in a Limited Interval Improves
    Sample and Distribution Quality in Diffusion Models"). An energy evaluated without a noise level takes every
    scale whole.

    Every term's conditioned and unconditional energies come from one network call
    (`Energy.conditioned_and_null`: a batch of ``2B``, or the shared layers once where the condition enters
    late). Build it with `guided`.
    """

    def __init__(self, weights: Sequence[float], terms: Sequence[Conditioned],
                 scales: Sequence[float] | None = None,
                 intervals: Sequence[tuple[float, float] | None] | None = None) -> None:
        if len(weights) != len(terms) or not terms:
            raise ValueError("Guided needs one weight per term and at least one term")
        scales = [1.0] * len(terms) if scales is None else [float(s) for s in scales]
        if len(scales) != len(terms) or not all(math.isfinite(s) and s > 0 for s in scales):
            raise ValueError(f"Guided needs one finite positive guidance scale per term, got {scales}")
        intervals = [None] * len(terms) if intervals is None else [check_interval(i) for i in intervals]
        if len(intervals) != len(terms):
            raise ValueError(f"Guided needs one guidance interval (or None) per term, got {len(intervals)} for"
                             f" {len(terms)} terms")
        input_shape, value_range = _check_compatible(terms)
        super().__init__(terms, input_shape, value_range)
        for term in terms:
            if not isinstance(term, Conditioned) or not term.base.has_null_condition:
                raise ValueError(
                    f"guided composition needs conditioned models trained with a null condition (label dropout);"
                    f" {term.expression()} is not one"
                )
        self.weights: tuple[float, ...] = tuple(float(w) for w in weights)
        self.scales: tuple[float, ...] = tuple(scales)
        """each term's guidance scale, multiplying its weight"""
        self.intervals: tuple[tuple[float, float] | None, ...] = tuple(intervals)
        """each term's guidance interval ``(lo, hi)``: the noise levels its scale applies at (None: every level)"""
        self.terms = nn.ModuleList(terms)

    def energy(self, x: Tensor, labels: Labels | None, sigma: Tensor | None = None) -> Tensor:
        """``mean_i E_i(x | 0) + sum_i s_i w_i (E_i(x | c_i) - E_i(x | 0))`` (``s_i``: `scales`), ``(B,)``."""
        null, guidance = self.parts(x, sigma)
        return null + guidance

    def parts(self, x: Tensor, sigma: NoiseLevel | None = None) -> tuple[Tensor, Tensor]:
        """The two halves of `energy`: ``E_0 = mean_i E_i(x | 0)`` and ``sum_i s_i w_i (E_i(x | c_i) - E_i(x | 0))``,
        each ``(B,)``."""
        nulls, guidance = [], []
        for w, (cond, uncond) in zip(self.weighted_scales(sigma), self.term_energies(x, sigma), strict=True):
            nulls.append(uncond)
            guidance.append(w * (cond - uncond))
        return torch.stack(nulls).mean(dim=0), torch.stack(guidance).sum(dim=0)

    def weighted_scales(self, sigma: NoiseLevel | None = None) -> list[float | Tensor]:
        """Each term's weight times its guidance scale at ``sigma``: the scale inside the term's interval, 1 outside
        it. A number for one level (or none), ``(B,)`` for a tensor of one level per item."""
        out: list[float | Tensor] = []
        for w, s, interval in zip(self.weights, self.scales, self.intervals, strict=True):
            if interval is None or sigma is None or s == 1.0:
                out.append(s * w)
            elif isinstance(sigma, Tensor) and sigma.dim() > 0:  # one level per item: no host sync
                inside = (sigma.reshape(-1) > interval[0]) & (sigma.reshape(-1) <= interval[1])
                out.append(w * torch.where(inside, s, 1.0).to(sigma.dtype))
            else:
                level = float(sigma)
                out.append(w * (s if interval[0] < level <= interval[1] else 1.0))
        return out

    def term_energies(self, x: Tensor, sigma: NoiseLevel | None = None) -> list[tuple[Tensor, Tensor]]:
        """Each term's ``(E_i(x | c_i), E_i(x | 0))``, each ``(B,)``, from one network call per term."""
        b = x.shape[0]
        out = []
        for term in self.terms:
            codes = {attr: as_index(value, x.device).expand(b) for attr, value in term.bound.items()}
            out.append(term.base.conditioned_and_null(x, codes, sigma))
        return out

    def expression(self) -> str:
        """The guided sum as text, e.g. ``guided(color[red] + shape[circle])``."""
        return "guided" + WeightedSum(self.weights, list(self.terms)).expression()

    def __repr__(self) -> str:
        return self.expression()


def guided(energy: Energy, scales: Callable[[Conditioned], float] | None = None,
           intervals: Callable[[Conditioned], tuple[float, float] | None] | None = None) -> Guided | Disjunction:
    """The guided form of a sum of conditioned models: ``guided(red + circle - 0.5 * square)`` is
    ``E_0 + (E(x|red) - E(x|0)) + (E(x|circle) - E(x|0)) - 0.5 (E(x|square) - E(x|0))``, with ``E_0`` the
    mean of the terms' unconditional energies; see `Guided`.

    Takes one conditioned model or a weighted sum of them, or a disjunction of such (``guided(s + (a | b))`` is the
    mixture ``guided(s + a) | guided(s + b)``, `branches`); anything else (an unconditioned model, a model without a
    trained null condition) is a ``ValueError`` naming it.
    ``scales`` gives each term's guidance scale (default 1), ``intervals`` each term's guidance interval (default
    None: every noise level).
    """
    if isinstance(energy, Guided):
        return energy
    if len(branches(energy)) > 1 or isinstance(energy, Disjunction):  # guided(s + (a | b)): (s + a) | (s + b), guided
        return mixture(energy, lambda branch: guided(branch, scales, intervals))  # type: ignore[return-value]
    weights, terms = (energy.weights, list(energy.terms)) if isinstance(energy, WeightedSum) else ([1.0], [energy])
    return Guided(weights, terms, None if scales is None else [scales(t) for t in terms],
                  None if intervals is None else [intervals(t) for t in terms])
