"""Attribute classifier and compositional accuracy (Du et al. 2021, Table 4: composition on CelebA-HQ).

A small CNN with one softmax head per attribute. Composed samples are scored by how often the
classifier recovers each conditioned attribute, and how often it recovers all of them at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composable_ebm.configs import MAX_IMAGE_SIZE, MAX_WIDTH, JSONConfig, check_attributes, check_size
from composable_ebm.energy import value_index
from composable_ebm.errors import InvalidInputError
from composable_ebm.images import as_float_images
from composable_ebm.model_types import register
from composable_ebm.pretrained import Pretrained

if TYPE_CHECKING:  # pragma: no cover; the data layer is only named in annotations
    from composable_ebm.data.base import ImageDataset


POOLINGS = ("mean", "flatten")
"""`ClassifierConfig.pooling` choices."""
ARCHITECTURES = ("plain", "residual")
"""`ClassifierConfig.architecture` choices."""


@dataclass(frozen=True)
class ClassifierConfig(JSONConfig):
    """Configuration of an `AttributeClassifier` (round-trips through JSON)."""

    name: str = "classifier"
    """The classifier's name."""
    image_size: int = 32
    """Side of the square input images."""
    in_channels: int = 3
    """Image channels."""
    width: int = 32
    """channels of the first conv; doubled at each of the three stages"""
    attributes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Attributes it reads: name -> value names (one head each)."""
    pooling: str = "mean"
    """what the heads read of the last feature map: ``mean``, its mean over positions (where a feature fires does
    not count), or ``flatten``, the whole map (where counts: for aligned images, such as faces, whose attributes are
    small and in one place, a mouth's curve at 64 px)"""
    architecture: str = "plain"
    """``plain``: three stages of two convs with group norm and SiLU, each ending in a 2x average pool; ``residual``:
    a stem conv, then three stages of a pre-activation residual block (one-group norm, ReLU) ending in a stride-2 conv
    (another network, for a second judge whose mistakes are not the first's)"""

    def __post_init__(self) -> None:
        check_size("ClassifierConfig", "image_size", self.image_size, low=8, high=MAX_IMAGE_SIZE)
        check_size("ClassifierConfig", "in_channels", self.in_channels, high=64)
        widest = 8 if self.architecture == "residual" else 4  # the last stage's channels, in widths
        check_size("ClassifierConfig", "width", self.width, low=8, high=MAX_WIDTH // widest)
        if self.width % 8:
            raise InvalidInputError(f"ClassifierConfig.width must be a multiple of 8 (group norm), got {self.width}")
        check_attributes("ClassifierConfig", self.attributes)
        if self.pooling not in POOLINGS:
            raise InvalidInputError(f"ClassifierConfig.pooling must be one of {', '.join(POOLINGS)}, got"
                                    f" {self.pooling!r}")
        if self.architecture not in ARCHITECTURES:
            raise InvalidInputError(f"ClassifierConfig.architecture must be one of {', '.join(ARCHITECTURES)}, got"
                                    f" {self.architecture!r}")


class _Residual(nn.Module):
    """``x + conv(relu(norm(conv(relu(norm(x))))))``: a pre-activation residual block (each norm over the whole of
    an image's channels and positions)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.GroupNorm(1, channels), nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1),
                                  nn.GroupNorm(1, channels), nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x)


def _body(config: ClassifierConfig) -> tuple[nn.Sequential, int]:
    """The convolutional stages of ``config.architecture`` (each halves the side) and their output channels."""
    layers: list[nn.Module] = []
    cin, w = config.in_channels, config.width
    if config.architecture == "residual":
        layers.append(nn.Conv2d(cin, w, 3, padding=1))
        for _ in range(3):
            layers += [_Residual(w), nn.GroupNorm(1, w), nn.ReLU(), nn.Conv2d(w, 2 * w, 3, stride=2, padding=1)]
            w *= 2
        return nn.Sequential(*layers, nn.ReLU()), w
    for _ in range(3):
        layers += [
            nn.Conv2d(cin, w, 3, padding=1), nn.GroupNorm(8, w), nn.SiLU(),
            nn.Conv2d(w, w, 3, padding=1), nn.GroupNorm(8, w), nn.SiLU(), nn.AvgPool2d(2),
        ]
        cin, w = w, 2 * w
    return nn.Sequential(*layers), cin


@register("attribute-classifier")
class AttributeClassifier(Pretrained, nn.Module):
    """Three conv stages (``architecture``: conv, group norm, SiLU, conv, 2x pool; or residual) -> global mean (or
    the whole last feature map: ``pooling``) -> one linear head per attribute."""

    config_class = ClassifierConfig
    hub_task = "image-classification"

    def __init__(self, config: ClassifierConfig) -> None:
        super().__init__()
        if not config.attributes:
            raise ValueError("an attribute classifier needs at least one attribute")
        self.config = config
        self.body, cin = _body(config)
        read = cin if config.pooling == "mean" else cin * (config.image_size // 8) ** 2
        self.heads = nn.ModuleDict({a: nn.Linear(read, len(v)) for a, v in config.attributes.items()})
        self.feature_dim = cin

    def feature_map(self, x: Tensor) -> Tensor:
        """The last conv stage's output ``(B, C, S / 8, S / 8)``. Images of another size or number of channels than
        it was trained on are one line (the network would read them, wrongly)."""
        c = self.config
        if x.ndim != 4 or tuple(x.shape[1:]) != (c.in_channels, c.image_size, c.image_size):
            raise InvalidInputError(
                f"classifier {c.name} reads {c.image_size}x{c.image_size} images with {c.in_channels} channel(s), got"
                f" images of shape {tuple(x.shape[1:])}; valid choices: a classifier trained at the images' size"
                " (cebm train-classifier --size), or images of its size")
        return self.body(x)

    def features(self, x: Tensor) -> Tensor:
        """Penultimate features ``(B, feature_dim)``, the last feature map's mean over positions: a feature network
        for FID on small images (whatever the heads read)."""
        return self.feature_map(x).mean(dim=(2, 3))

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        """Logits per attribute: ``{attr: (B, num_values)}``."""
        h = self.feature_map(x)
        h = h.mean(dim=(2, 3)) if self.config.pooling == "mean" else h.flatten(1)
        return {a: head(h) for a, head in self.heads.items()}

    def predict(self, x: Tensor, batch_size: int = 256) -> dict[str, Tensor]:
        """Predicted value indices per attribute, ``{attr: (B,)}``, in eval mode without gradients."""
        was_training = self.training
        self.eval()
        out: dict[str, list[Tensor]] = {a: [] for a in self.heads}
        with torch.no_grad():
            for chunk in x.split(batch_size):
                for a, logits in self(chunk).items():
                    out[a].append(logits.argmax(dim=1))
        self.train(was_training)
        return {a: torch.cat(v) for a, v in out.items()}


def train_classifier(
    classifier: AttributeClassifier,
    images: Tensor,
    labels: Mapping[str, Tensor],
    steps: int = 500,
    batch_size: int = 64,
    lr: float = 2e-3,
    seed: int = 0,
    flip: bool = False,
) -> list[float]:
    """Adam on the summed cross-entropy of every head; returns the loss per step.

    ``images`` may be uint8 (scaled by 1/255) or float in ``[0, 1]``.
    """
    missing = set(classifier.heads) - set(labels)
    if missing:
        raise ValueError(f"no labels for classifier attributes {sorted(missing)}")
    device = next(classifier.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(classifier.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    classifier.train()
    losses = []
    for _ in range(steps):
        idx = torch.randint(images.shape[0], (batch_size,), generator=gen)
        x = as_float_images(images[idx].to(device))
        if flip:
            mirror = (torch.rand(batch_size, generator=gen) < 0.5).to(device).view(-1, 1, 1, 1)
            x = torch.where(mirror, x.flip(-1), x)
        logits = classifier(x)
        loss = sum(F.cross_entropy(logits[a], labels[a][idx].to(device)) for a in classifier.heads)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    classifier.eval()
    return losses


def attribute_accuracy(classifier: AttributeClassifier, images: Tensor, labels: Mapping[str, Tensor]) -> dict[str, float]:
    """Accuracy of each head on labelled images."""
    pred = classifier.predict(as_float_images(images).to(next(classifier.parameters()).device))
    return {a: float((pred[a].cpu() == labels[a].cpu()).float().mean()) for a in classifier.heads}


@dataclass
class CompositionScore:
    """Per-attribute accuracy and joint accuracy (every conditioned attribute right at once)."""

    per_attribute: dict[str, float]
    joint: float
    n: int


def compositional_accuracy(
    samples: Tensor, classifier: AttributeClassifier, target: Mapping[str, str | int]
) -> CompositionScore:
    """How often the classifier recovers each target attribute value in ``samples`` ``(N, C, H, W)``.

    ``target`` maps attributes to value names or indices, e.g. ``{"color": "red", "shape": "circle"}``.
    """
    attributes = classifier.config.attributes
    wanted = {attr: value_index(attributes, attr, value) for attr, value in target.items()}
    pred = classifier.predict(samples.float().to(next(classifier.parameters()).device))
    hits = {a: pred[a].cpu() == v for a, v in wanted.items()}
    joint = torch.stack(list(hits.values())).all(dim=0)
    return CompositionScore({a: float(h.float().mean()) for a, h in hits.items()}, float(joint.float().mean()), samples.shape[0])


def fit_classifier(data: ImageDataset, name: str, held_out: float = 0.1, steps: int = 1500, seed: int = 0,
                   width: int = 32, device: torch.device | str = "cpu", pooling: str = "mean",
                   architecture: str = "plain") -> tuple[AttributeClassifier, dict[str, float]]:
    """An `AttributeClassifier` of every attribute of ``data`` (an `ImageDataset`), trained on all
    but a share ``held_out`` of its images (drawn with ``seed``), and its accuracy per attribute on those (empty when
    none are kept aside)."""
    n = len(data)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    aside = int(round(held_out * n))
    test, train = order[:aside], order[aside:]
    config = ClassifierConfig(name=name, image_size=data.images.shape[-1], in_channels=data.images.shape[1],
                              width=width, attributes=dict(data.attributes), pooling=pooling,
                              architecture=architecture)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        classifier = AttributeClassifier(config).to(device)
    train_classifier(classifier, data.images[train], {a: v[train] for a, v in data.labels.items()}, steps=steps,
                     seed=seed)
    accuracy = (attribute_accuracy(classifier, data.images[test], {a: v[test] for a, v in data.labels.items()})
                if aside else {})
    return classifier, accuracy


@dataclass
class FolderClassifier:
    """What `fit_folder_classifier` made: the classifier, where it is saved, and its held-out accuracy."""

    classifier: AttributeClassifier
    folder: Path
    accuracy: dict[str, float]  # per attribute, on the rows kept aside
    held_out: int  # how many rows were kept aside


def fit_folder_classifier(
    folder: str | Path, out: str | Path, attributes: list[str] | None = None,
    attribute_file: str = "list_attr_celeba.txt", size: int = 32, steps: int = 1500, held_out: float = 0.1,
    seed: int = 0, device: torch.device | str = "cpu", overwrite: bool = False, pooling: str = "mean",
    architecture: str = "plain", width: int = 32, name: str | None = None,
) -> FolderClassifier:
    """Train an `AttributeClassifier` on an image folder's attributes (`composable_ebm.data.attribute_folder`) and
    save it to ``out``: the classifier `cebm eval compose` scores compositions of that folder's models with.

    A share ``held_out`` of the rows (drawn with ``seed``) is kept out of training and the accuracy on it returned.
    An ``out`` that exists and is not empty is refused before training unless ``overwrite``.
    """
    from composable_ebm.data.folder import attribute_folder
    from composable_ebm.model_cards import model_card
    from composable_ebm.persistence import check_new_folder
    from composable_ebm.models import save_model

    folder, out = Path(folder), Path(out)
    if pooling not in POOLINGS:
        raise InvalidInputError(f"unknown pooling {pooling!r}; valid choices: {', '.join(POOLINGS)}")
    if architecture not in ARCHITECTURES:
        raise InvalidInputError(f"unknown architecture {architecture!r}; valid choices: {', '.join(ARCHITECTURES)}")
    if not overwrite:
        check_new_folder(out)
    data = attribute_folder(folder, attribute_file, image_size=size)
    if attributes:
        try:
            data = data.select_attributes(attributes)
        except ValueError as err:
            raise InvalidInputError(f"{folder / attribute_file}: {err}") from err
    n = len(data)
    aside = int(round(held_out * n))
    if n - aside < 2:
        raise InvalidInputError(f"{folder}: {n} images, too few to train a classifier (and keep {aside} aside)")
    classifier, accuracy = fit_classifier(data, name or f"{folder.name}-classifier", held_out=held_out, steps=steps,
                                          seed=seed, width=width, device=device, pooling=pooling,
                                          architecture=architecture)
    notes = (f"Trained for {steps} steps on {n - aside} images of `{folder.name}`; read right on {aside} held-out"
             " images: " + ", ".join(f"{a} {v:.3f}" for a, v in accuracy.items()) + ".") if aside else None
    save_model(classifier.cpu(), out, card=model_card(classifier, location=str(out), notes=notes), overwrite=overwrite)
    return FolderClassifier(classifier, out, accuracy, aside)
