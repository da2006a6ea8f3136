"""How well a conditional EBM learned its attribute, and whether it is ready to compose.

Three measurements on a labelled dataset with several attributes (e.g. Shapes):

- **conditioned accuracy**: sample every value of the model's attribute and read the samples with
  an attribute classifier: how often the classifier finds the value that was asked for;
- **mode coverage**: the distribution of every *other* attribute among those samples, against the
  data's distribution for the same value (a model that draws only red squares when asked for
  "square" has collapsed onto one colour);
- **held-out energy gap**: the mean energy of held-out images (a combination the model never saw)
  minus that of seen images with the same conditioned value, in units of the seen images' energy
  spread. A model that is indifferent to the attributes it is not about has a gap near zero, which
  is what zero-shot composition needs (Du et al. 2020, "Compositional Visual Generation with Energy
  Based Models").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from composable_ebm.energy import Energy
from composable_ebm.evaluation.classifier import AttributeClassifier
from composable_ebm.images import as_float_images


def value_distribution(indices: Tensor, values: tuple[str, ...]) -> dict[str, float]:
    """Fraction of each value name among value ``indices`` ``(N,)``."""
    counts = torch.bincount(indices.cpu().long(), minlength=len(values)).float()
    total = max(float(counts.sum()), 1.0)
    return {v: float(c) / total for v, c in zip(values, counts, strict=True)}


def max_deviation(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Largest absolute difference between two value distributions."""
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@dataclass
class ValueReport:
    """What the samples of one conditioned value show."""

    attribute: str
    value: str
    n: int
    accuracy: float  # fraction of samples read as ``value``
    other: dict[str, dict[str, float]]  # other attribute -> value -> fraction among the samples
    data_other: dict[str, dict[str, float]]  # the same in the data with this value

    @property
    def coverage_deviation(self) -> dict[str, float]:
        """Per other attribute: the largest gap between the samples' and the data's distribution."""
        return {a: max_deviation(self.other[a], self.data_other[a]) for a in self.other}


def conditional_report(
    energy: Energy,
    attribute: str,
    classifier: AttributeClassifier,
    data_labels: Mapping[str, Tensor],
    n: int,
    seed: int = 0,
    batch_size: int = 256,
) -> list[ValueReport]:
    """Sample ``n`` images of every value of ``attribute`` with the model's default settings and read them.

    Args:
        energy: a conditional model with ``attribute`` among its attributes.
        classifier: reads every attribute in ``data_labels``.
        data_labels: labels of the data the model was trained on (attribute -> indices ``(N,)``),
            the reference for mode coverage.
        n: samples per value, drawn in chunks of ``batch_size``.
    """
    values = energy.attributes.get(attribute)
    if values is None:
        raise ValueError(f"{energy.expression()} has no attribute {attribute!r}; valid: {sorted(energy.attributes)}")
    others = [a for a in classifier.config.attributes if a != attribute and a in data_labels]
    reports = []
    for index, value in enumerate(values):
        conditioned = energy.condition(**{attribute: value})
        chunks = []
        for i, start in enumerate(range(0, n, batch_size)):
            chunks.append(conditioned.sample(min(batch_size, n - start), seed=seed + 1000 * index + i))
        samples = torch.cat(chunks)
        pred = classifier.predict(samples.to(next(classifier.parameters()).device))
        in_value = data_labels[attribute] == index
        reports.append(
            ValueReport(
                attribute,
                value,
                n,
                float((pred[attribute].cpu() == index).float().mean()),
                {a: value_distribution(pred[a], classifier.config.attributes[a]) for a in others},
                {a: value_distribution(data_labels[a][in_value], classifier.config.attributes[a]) for a in others},
            )
        )
    return reports


@dataclass
class EnergyGap:
    """Held-out minus seen mean energy under one conditioned value, in units of the seen spread."""

    attribute: str
    value: str
    heldout_mean: float
    seen_mean: float
    seen_std: float
    n_heldout: int
    n_seen: int

    @property
    def gap(self) -> float:
        return (self.heldout_mean - self.seen_mean) / self.seen_std


@torch.no_grad()
def heldout_energy_gap(
    energy: Energy,
    attribute: str,
    heldout_images: Tensor,
    heldout_labels: Mapping[str, Tensor],
    seen_images: Tensor,
    seen_labels: Mapping[str, Tensor],
) -> list[EnergyGap]:
    """For every value of ``attribute`` that held-out images have: the `EnergyGap` under that value.

    ``seen_*`` are images of the model's training split; the gap compares held-out images with
    seen images that carry the same value of ``attribute``.
    """
    values = energy.attributes[attribute]
    device = energy.device
    out = []
    for index, value in enumerate(values):
        held = heldout_images[heldout_labels[attribute] == index]
        seen = seen_images[seen_labels[attribute] == index]
        if held.shape[0] == 0 or seen.shape[0] < 2:
            continue
        conditioned = energy.condition(**{attribute: value})
        e_held = _energies(conditioned, held, device)
        e_seen = _energies(conditioned, seen, device)
        out.append(
            EnergyGap(attribute, value, float(e_held.mean()), float(e_seen.mean()), float(e_seen.std()),
                      held.shape[0], seen.shape[0])
        )
    return out


def _energies(energy: Energy, images: Tensor, device: torch.device, batch_size: int = 512) -> Tensor:
    return torch.cat([energy(as_float_images(chunk).to(device)).cpu() for chunk in images.split(batch_size)])
