"""What every dataset shares: `ImageDataset`, the `DataConfig` base and the `DATASETS` registry.

A dataset is one file in this package: a frozen dataclass of its settings that subclasses `DataConfig`, registered
with ``@dataset("name")``, whose ``build`` returns the data. A recipe's ``[data]`` table names it with
``dataset = "name"`` and gives that class's settings; another installed package adds one through the
``composable_ebm.datasets`` entry points.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar

import torch
from torch import Tensor

from composable_ebm.energy import value_index
from composable_ebm.errors import InvalidInputError
from composable_ebm.images import as_float_images
from composable_ebm.registry import Registry


@dataclass
class ImageDataset:
    """Images ``(N, C, H, W)`` (float in ``[0, 1]`` or uint8, kept on the host) with attribute labels.

    ``attributes`` maps each attribute to its value names; ``labels[attr]`` holds value
    indices ``(N,)``. Indexing returns ``(image, {attr: index})`` for torch data loaders.
    """

    images: Tensor
    labels: dict[str, Tensor]
    attributes: dict[str, tuple[str, ...]]
    name: str = "dataset"
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.images.shape[0]
        for attr, idx in self.labels.items():
            if attr not in self.attributes:
                raise ValueError(f"labels for unknown attribute {attr!r}; attributes: {sorted(self.attributes)}")
            if idx.shape != (n,):
                raise ValueError(f"labels[{attr!r}] must have shape ({n},), got {tuple(idx.shape)}")

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, dict[str, Tensor]]:
        return as_float_images(self.images[i]), {a: v[i] for a, v in self.labels.items()}

    def select_attributes(self, names: Sequence[str]) -> ImageDataset:
        """The same images with only the named attributes (e.g. one attribute per model)."""
        unknown = sorted(set(names) - set(self.attributes))
        if unknown:
            raise ValueError(f"unknown attribute(s) {unknown}; valid attributes: {sorted(self.attributes)}")
        return ImageDataset(
            self.images, {a: self.labels[a] for a in names}, {a: self.attributes[a] for a in names}, self.name,
            dict(self.info),
        )

    def without(self, combinations: Sequence[Mapping[str, str]]) -> ImageDataset:
        """The items that match none of ``combinations`` (attribute -> value name), e.g. a held-out pair."""
        keep = ~combination_mask(self.labels, self.attributes, combinations)
        return ImageDataset(self.images[keep], {a: v[keep] for a, v in self.labels.items()}, dict(self.attributes),
                            self.name, dict(self.info))


def combination_mask(labels: Mapping[str, Tensor], attributes: Mapping[str, Sequence[str]],
                     combinations: Sequence[Mapping[str, str]]) -> Tensor:
    """``(N,)`` bool: which items match any of ``combinations`` (each attribute -> value name, all at once)."""
    n = next(iter(labels.values())).shape[0] if labels else 0
    held = torch.zeros(n, dtype=torch.bool)
    for combo in combinations:
        match = torch.ones(n, dtype=torch.bool)
        for attr, value in combo.items():
            index = value_index(attributes, attr, value)  # an unknown attribute or value: one line naming them
            match &= labels[attr] == index
        held |= match
    return held


@dataclass(frozen=True)
class DataConfig:
    """Settings every dataset has; each dataset's config adds its own."""

    name: ClassVar[str] = ""
    """the dataset's registered name (set by `dataset`)"""
    attributes: tuple[str, ...] = ()
    """the attributes the model is conditioned on; empty: unconditional"""

    def build(self, base: Path | None = None) -> ImageDataset | Tensor:
        """The data (all of its attributes); ``base`` is the folder relative paths are resolved from (the recipe's)."""
        raise NotImplementedError(f"{type(self).__name__} must implement build(base)")

    def render(self, out: Path) -> Path:
        """Write the data as a CelebA-format folder at ``out`` (``cebm data NAME --out DIR``), for a dataset that is
        drawn rather than read; the others refuse in one line."""
        raise InvalidInputError(f"the {self.name} dataset is read, not drawn: it has no folder to render")

    def describe(self, base: Path | None = None) -> tuple[dict[str, tuple[str, ...]], tuple[int, ...]]:
        """Every attribute's value names and one item's shape. A dataset that can say so without building its data
        (decoding no image) overrides this; by default the data is built."""
        data = self.build(base)
        if isinstance(data, ImageDataset):
            return dict(data.attributes), tuple(data.images.shape[1:])
        return {}, tuple(data.shape[1:])


DATASETS: Registry[type[DataConfig]] = Registry("dataset", package="composable_ebm.data", group="composable_ebm.datasets")
"""Dataset configs by the name a recipe's ``dataset =`` gives."""

C = TypeVar("C", bound=type)


def dataset(name: str) -> Callable[[C], C]:
    """Class decorator: register a `DataConfig` subclass under ``name``."""

    def add(cls: C) -> C:
        cls.name = name
        return DATASETS.register(name)(cls)

    return add


def check_holdout(holdout: Sequence[Mapping[str, str]], attributes: Mapping[str, Sequence[str]], owner: str) -> None:
    """Every held-out combination names known attributes and values (one line naming the valid ones)."""
    for combo in holdout:
        if not isinstance(combo, Mapping) or not combo:
            raise InvalidInputError(f"{owner}.holdout must be a list of tables of attribute = value, got {combo!r}")
        for attr, value in combo.items():
            try:
                value_index(attributes, attr, value)
            except ValueError as err:
                raise InvalidInputError(f"{owner}.holdout: {err}") from err


def resolve_root(root: str, base: Path | None) -> Path:
    """A data folder as a recipe writes it: relative paths start at ``base`` (the recipe's folder) when given."""
    path = Path(root).expanduser()
    return path if path.is_absolute() or base is None else base / path
