"""Denoising score matching for noise-conditioned energies (Vincent 2011; Song & Ermon 2019).

For data ``x``, a level ``sigma`` drawn from the model's ``noise_range`` (log-uniformly, or log-normally:
`LevelDistribution`) and unit noise ``z``, the
noised point is ``x + sigma z`` and the loss is ``|sigma dE/dx(x + sigma z, sigma) - z|^2`` per pixel: the energy's
input gradient predicts the noise, so ``-dE/dx`` is the score of the noised data (the noise-prediction
weighting of Ho et al. 2020). The gradient is taken with ``create_graph``, so the loss reaches the parameters
through it. No chain runs and nothing is kept between iterations: an iteration is one forward and two backward
passes (`DenoisingScoreMatching`, the objective the training loop runs for a noise-conditioned model).

That weighting counts a level's error in the denoised image ``x - sigma^2 dE/dx`` by ``1 / sigma^2``: the high
levels, where the chains decide an image's layout and colours, count least. ``weighting="edm"`` multiplies each
level's loss by ``1 + sigma^2 / sigma_data^2``, which is the weighting of Karras et al. 2022 ("Elucidating the
Design Space of Diffusion-Based Generative Models", Eq. 8 with their ``lambda(sigma)``, written on the noise), divided
by its mean over the levels drawn, so the weights average 1.

Denoising trains an energy's input gradient, not its level: each condition's energy is free up to a constant per
level. ``classifier_weight`` adds the implicit classifier's cross-entropy (`implicit_classifier_loss`), which fixes
those constants so that the conditions' energies at one level differ by their log-odds.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from composable_ebm.accel.derivatives import second_derivatives
from composable_ebm.accel.precision import autocast
from composable_ebm.energy import Energy, Labels, NoiseConditioned
from composable_ebm.errors import InvalidInputError
from composable_ebm.accel.graphs import capture
from composable_ebm.training.config import WEIGHTINGS, DenoisingConfig
from composable_ebm.training.faults import fault_reason
from composable_ebm.training.record import StepRecord

if TYPE_CHECKING:  # pragma: no cover; the loop hands itself to its objective
    from composable_ebm.training.loop import Loop

MAX_GRAPHED_DATA_BYTES = 1 << 31
"""training data larger than this (2 GiB) stays on the host, and an iteration runs without a CUDA graph"""


@dataclass
class DenoisingOutput:
    """The loss of one iteration and its statistics."""

    loss: Tensor  # the objective: the denoising loss, plus the weighted classifier term when it is on
    energy: Tensor  # mean energy of the noised points (detached)
    denoising: Tensor  # mean squared error of the predicted noise, per pixel (detached)
    classifier: Tensor | None = None  # the implicit classifier's cross-entropy (detached), None when off


def noise_range(energy: Energy) -> tuple[float, float]:
    """The levels a noise-conditioned model trains on (`NoiseConditioned.noise_range`); one line when it has none."""
    found = energy.noise_range if isinstance(energy, NoiseConditioned) else None
    if not (isinstance(found, tuple) and len(found) == 2 and 0 < found[0] <= found[1]):
        raise InvalidInputError(f"{energy.name} depends on a noise level but states no noise_range (lowest, highest) to"
                                " train on; a noise-conditioned network must give one")
    return float(found[0]), float(found[1])




def _phi(t: float) -> float:
    """The standard normal's distribution function."""
    return 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))


@dataclass(frozen=True)
class LevelDistribution:
    """How training draws noise levels within ``[low, high]`` (`DenoisingConfig.levels`): log-uniformly, or with
    ``ln sigma`` normal (``mean``, ``std``) truncated to the range, drawn exactly by its inverse distribution
    function."""

    low: float
    high: float
    kind: str = "log-uniform"
    mean: float = -1.2
    std: float = 1.2

    def __post_init__(self) -> None:
        if self.kind == "log-normal" and self._mass() < 1e-9:
            raise InvalidInputError(f"log-normal levels of ln sigma mean {self.mean:g} and std {self.std:g} put almost"
                                    f" no level within the model's noise range [{self.low:g}, {self.high:g}]; valid"
                                    " choices: a level_mean within [ln low, ln high], or a wider level_std")

    def _bounds(self) -> tuple[float, float]:
        return (math.log(self.low) - self.mean) / self.std, (math.log(self.high) - self.mean) / self.std

    def _mass(self) -> float:
        a, b = self._bounds()
        return _phi(b) - _phi(a)

    def draw(self, n: int, generator: torch.Generator, device: torch.device, dtype: torch.dtype) -> Tensor:
        """``n`` levels, ``(n,)``."""
        u = torch.rand(n, generator=generator, device=device, dtype=dtype)
        lo, hi = math.log(self.low), math.log(self.high)
        if self.kind == "log-uniform" or hi == lo:
            return torch.exp(lo + u * (hi - lo))
        a, b = (_phi(t) for t in self._bounds())
        return torch.exp((self.mean + self.std * torch.special.ndtri(a + u * (b - a))).clamp(lo, hi))

    def mean_square(self) -> float:
        """``E[sigma^2]`` under the distribution: ``(high^2 - low^2) / (2 log(high / low))`` log-uniformly
        (``high^2`` when they are one level); ``exp(2 mean + 2 std^2)`` times the mass the range keeps of a normal
        shifted by ``2 std``, over its own mass, log-normally."""
        if self.high == self.low:
            return self.high * self.high
        if self.kind == "log-uniform":
            return (self.high ** 2 - self.low ** 2) / (2 * math.log(self.high / self.low))
        a, b = self._bounds()
        shifted = _phi(b - 2 * self.std) - _phi(a - 2 * self.std)
        return math.exp(2 * self.mean + 2 * self.std ** 2) * shifted / self._mass()


def edm_weights(sigma: Tensor, sigma_data: float, levels: LevelDistribution) -> Tensor:
    """``1 + sigma^2 / sigma_data^2`` per level, over its mean for levels drawn from ``levels``, so the weights
    average 1."""
    return (1 + sigma * sigma / sigma_data**2) / (1 + levels.mean_square() / sigma_data**2)


class DenoisingObjective(nn.Module):
    """The denoising score-matching loss of ``energy`` as a module (so DDP can wrap it), its levels weighted as
    ``weighting`` says (`WEIGHTINGS`; module docstring)."""

    def __init__(self, energy: Energy, weighting: str = "noise", classifier_weight: float = 0.0,
                 value_shares: dict[str, Tensor] | None = None, own_derivatives: str = "cpu",
                 levels: str = "log-uniform", level_mean: float = -1.2, level_std: float = 1.2) -> None:
        super().__init__()
        self.energy = energy
        self.own_derivatives = own_derivatives  # where the layers state their own second derivatives (Speed)
        self.classifier_weight = float(classifier_weight)
        self.log_shares = {a: torch.log(p.clamp_min(1e-12)) for a, p in (value_shares or {}).items()}
        if self.classifier_weight > 0 and not self.log_shares:
            raise InvalidInputError(f"classifier_weight {classifier_weight:g} asks for the implicit classifier of"
                                    f" {energy.name}'s conditions, and it is trained on no labelled attribute; valid"
                                    " choices: classifier_weight = 0, or a conditional model with labelled data")
        self.levels = LevelDistribution(*noise_range(energy), levels, level_mean, level_std)
        if weighting not in WEIGHTINGS:
            raise InvalidInputError(f"unknown loss weighting {weighting!r}; valid choices: {list(WEIGHTINGS)}")
        self.weighting = weighting
        self.sigma_data = energy.sigma_data if isinstance(energy, NoiseConditioned) else None
        if weighting == "edm" and not (isinstance(self.sigma_data, (int, float)) and self.sigma_data > 0):
            raise InvalidInputError(f"loss weighting 'edm' needs the data's standard deviation, and {energy.name}"
                                    " states no sigma_data; valid choices: 'noise', or a model with a sigma_data"
                                    " (the denoising-unet's [model] sigma_data)")

    def forward(self, x: Tensor, labels: Labels | None, generator: torch.Generator) -> DenoisingOutput:
        sigma = self.levels.draw(x.shape[0], generator, x.device, x.dtype)
        z = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        noised = x + sigma.view((-1,) + (1,) * (x.ndim - 1)) * z
        weight = edm_weights(sigma, self.sigma_data, self.levels) if self.weighting == "edm" else None
        loss, e = self.noise_prediction(noised, sigma, z, labels, weight)
        if self.classifier_weight == 0 or not labels:
            return DenoisingOutput(loss, e.detach().mean(), loss.detach())
        ce = implicit_classifier_loss(self.energy, noised, sigma, labels, self.log_shares)
        return DenoisingOutput(loss + self.classifier_weight * ce, e.detach().mean(), loss.detach(), ce.detach())

    def noise_prediction(self, noised: Tensor, sigma: Tensor, z: Tensor, labels: Labels | None,
                         weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The loss of predicting the noise ``z`` of ``noised`` (at levels ``sigma``, ``(B,)``) by ``sigma`` times
        the energy's input gradient, each item's error times ``weight`` (``(B,)``) when given, and the energies
        ``(B,)``."""
        noised = noised.detach().requires_grad_(True)
        with second_derivatives(self.own_derivatives):  # the input gradient is differentiated again
            e = self.energy(noised, labels, sigma=sigma)
        (grad,) = torch.autograd.grad(e.sum(), noised, create_graph=True)
        return noise_prediction_loss(grad, sigma, z, weight), e


def implicit_classifier_loss(energy: Energy, noised: Tensor, sigma: Tensor, labels: Labels,
                             log_shares: dict[str, Tensor]) -> Tensor:
    """The cross-entropy of the conditions' implicit classifier at the noised points, averaged over the attributes of
    ``log_shares`` (attribute -> log of each value's share of the training labels): for each attribute, the energy of
    every item under each of its values (the other attributes as labelled), and ``-E(x_sigma, sigma | c) + log p(c)``
    as the logits of the value the item was drawn from. Items dropped to the null condition for that attribute count
    for nothing (masked, so the shapes never depend on the data: a CUDA graph can replay it). Minimised,
    ``exp(-E(x | c))`` is ``p(x | c)`` times one factor per level shared by every value."""
    noised = noised.detach()
    n = noised.shape[0]
    terms = []
    for attr, log_share in log_shares.items():
        k, y = log_share.numel(), labels[attr]
        rest = {a: v.repeat(k) for a, v in labels.items() if a != attr}
        values = torch.arange(k, device=noised.device).repeat_interleave(n)
        e = energy(noised.repeat((k,) + (1,) * (noised.ndim - 1)), {**rest, attr: values}, sigma=sigma.repeat(k))
        logits = -e.float().view(k, n).T + log_share.to(noised.device)
        keep = (y >= 0).float()
        ce = torch.nn.functional.cross_entropy(logits, y.clamp_min(0).long(), reduction="none")
        terms.append((ce * keep).sum() / keep.sum().clamp_min(1.0))
    return torch.stack(terms).mean()


def noise_prediction_loss(grad: Tensor, sigma: Tensor, z: Tensor, weight: Tensor | None = None) -> Tensor:
    """The mean squared error, per pixel, of ``sigma`` (``(B,)``) times the energy's input gradient ``grad`` as a
    prediction of the noise ``z``; with ``weight`` (``(B,)``), each item's error times its weight."""
    shape = (-1,) + (1,) * (grad.ndim - 1)
    error = (sigma.view(shape) * grad - z).pow(2)
    return (error if weight is None else error * weight.view(shape)).mean()


def value_shares(trainer: Loop) -> dict[str, Tensor]:
    """Each labelled attribute's values' shares of the training labels (the implicit classifier's prior)."""
    attributes = getattr(trainer.energy, "attributes", None) or {}
    out = {}
    for a, v in getattr(trainer, "labels", {}).items():
        if a in attributes:
            counts = torch.bincount(v[v >= 0].long().cpu(), minlength=len(attributes[a])).float()
            out[a] = counts / counts.sum().clamp_min(1.0)
    return out


class DenoisingScoreMatching:
    """One iteration of denoising score matching for the training loop (`composable_ebm.training.Trainer`): the
    positives, the loss at ``precision`` and its backward pass, replayed from a CUDA graph where it can be; the loop
    applies Adam and the EMA. It keeps nothing between iterations."""

    def __init__(self, trainer: Loop, config: DenoisingConfig) -> None:
        self.trainer, self.config = trainer, config
        self.loss = trainer.parallel(DenoisingObjective(trainer.energy, config.loss_weighting,
                                                        config.classifier_weight, value_shares(trainer),
                                                        trainer.speed.own_derivatives, config.levels,
                                                        config.level_mean, config.level_std))
        self._graph: tuple[torch.cuda.CUDAGraph, Tensor, list[Tensor | None]] | None = None
        self._graph_failed = False  # a capture failed: it runs eagerly from then on

    def step(self) -> StepRecord:
        stats = self._replay() if self._graphable() else None
        loss, e_noised, grad_norm, dsm, classifier = (self._stats() if stats is None else stats).tolist()
        return StepRecord(loss=loss, e_noised=e_noised, grad_norm=grad_norm, loss_dsm=dsm,
                          loss_classifier=classifier if self.config.classifier_weight > 0 else None)

    def applied(self) -> None:
        """Nothing to keep from an applied iteration."""

    def fault(self, record: StepRecord) -> str | None:
        """Why ``record`` is a fault: a non-finite statistic."""
        return fault_reason(record, None)

    def _stats(self) -> Tensor:
        """Positives, the loss, its backward pass and the clip; returns the loss, the noised points' mean energy, the
        gradient norm, the denoising loss and the classifier term (0 when off) as one float tensor on the device
        (nothing is read back)."""
        loop = self.trainer
        x_pos, pos_labels = loop.positives(loop.config.batch_size)
        with autocast(loop.device.type, self.config.precision, doing="training"):
            noised: DenoisingOutput = self.loss(x_pos, pos_labels or None, loop.generator)
        grad_norm = loop.backward(noised.loss)
        classifier = noised.classifier if noised.classifier is not None else torch.zeros_like(noised.denoising)
        return torch.stack([noised.loss.detach().float(), noised.energy.float(), grad_norm.float(),
                            noised.denoising.float(), classifier.float()])

    def _graphable(self) -> bool:
        """Whether this iteration replays a CUDA graph (`_replay`): on by default on CUDA (the run's `Speed`), for
        one process, with training data that fits the device's memory budget for it."""
        loop = self.trainer
        return (loop.device.type == "cuda" and loop.speed.cuda_graphs and not loop.distributed and not self._graph_failed
                and loop.images.numel() * loop.images.element_size() <= MAX_GRAPHED_DATA_BYTES)

    def _replay(self) -> Tensor | None:
        """`_stats` replayed from a CUDA graph (captured at the first call: an iteration is a few hundred small
        kernels, launch-bound on a GPU), or ``None`` where the capture failed: one warning, and training goes on
        eagerly with the generator's draws unchanged.

        The graph draws the batch from a copy of the training data on the device and writes the gradients into
        tensors it owns; they are given back to the parameters after each replay, so Adam reads them as it would
        read an eager backward pass's. Adam, the EMA and the fault check stay outside: a faulted iteration's graph
        has run, but its gradients are never applied."""
        loop = self.trainer
        params = [p for p in loop.energy.parameters() if p.requires_grad]
        if self._graph is None:
            if loop.images.device != loop.device:
                loop.images = loop.images.to(loop.device)  # the batch is drawn inside the graph
            try:
                graph, stats = capture(self._stats, loop.generator, loop.device)
            except RuntimeError as err:
                self._graph_failed = True
                loop.optimizer.zero_grad(set_to_none=True)
                warnings.warn(f"CUDA graph capture failed for the training step ({str(err).splitlines()[0]}); it runs"
                              " without graphs", RuntimeWarning, stacklevel=4)
                return None
            self._graph = (graph, stats, [p.grad for p in params])
        graph, stats, grads = self._graph
        graph.replay()
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        return stats

    # ------------------------------------------------------------- its state
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any], resize: bool = False) -> None:
        """Nothing to restore (a checkpoint of a run before the objectives were separate holds a one-sample buffer
        that kept nothing: ignored)."""

    def restored(self) -> None:
        """The loop restored a checkpoint: a graph captured before is captured again from the restored state."""
        self._graph = None

    def log_fields(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------- its cost
    def evaluations_per_step(self) -> int:
        """About three evaluations' worth: one with a differentiable gradient, then its backward pass; with the
        classifier term, two more (a forward and its backward pass) per value of each attribute."""
        extra = 2 * sum(p.numel() for p in self.loss_module().log_shares.values()) if self.config.classifier_weight else 0
        return 3 + extra

    def loss_module(self) -> DenoisingObjective:
        """The objective (unwrapped from DDP where the run is distributed)."""
        return getattr(self.loss, "module", self.loss)

    def state_bytes(self) -> int:
        return 0
