"""Training recipes: TOML files parsed at the edge into the typed configs.

A recipe has four tables::

    [model]      # type = "resnet" (default) or "mlp"; preset = "paper_32" | "paper_128"; any config field
    [data]       # dataset = "shapes" | "digits" | "folder" | "cifar10" | "toy2d"; what the model conditions on
    [trainer]    # TrainerConfig fields, with [trainer.sampler] and [trainer.chain_augment] sub-tables
    [sampling]   # the SamplerConfig saved with the model (used by sample / compose), [sampling.augment]

A recipe may start from another with ``base = "other.toml"`` (a path relative to the recipe):
its tables are merged key by key, the recipe's own values winning. Optional tables
(``trainer.chain_augment``, ``sampling.augment``) are switched off with ``= false``.
Unknown keys anywhere are an error naming the valid ones.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from composable_ebm.configs import config_from_dict
from composable_ebm.data import ImageDataset, attribute_folder, cifar10, digits, sample_toy, shapes
from composable_ebm.energy import Energy
from composable_ebm.nets import MLPConfig, MLPEnergy, ResNetConfig, ResNetEnergy
from composable_ebm.sampling import SamplerConfig
from composable_ebm.training import TrainerConfig

DATASETS = ("shapes", "digits", "folder", "cifar10", "toy2d")


@dataclass(frozen=True)
class DataConfig:
    """Which dataset to build, and which of its attributes the model is conditioned on."""

    dataset: str = "shapes"
    attributes: tuple[str, ...] = ()  # conditioning attributes; empty: unconditional
    n: int = 10000  # shapes / toy2d: number of items
    size: int = 32  # image size
    seed: int = 0
    holdout: tuple[dict[str, str], ...] = ()  # shapes: combinations kept out of training
    channels: int = 1  # digits: 1 or 3
    root: str | None = None  # folder / cifar10: where the data lives
    attribute_file: str = "list_attr_celeba.txt"  # folder: CelebA-format table
    folder_attributes: dict[str, str] = field(default_factory=dict)  # folder: ours -> column ("-Col" negates)
    density: str = "8gaussians"  # toy2d

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"unknown dataset {self.dataset!r}; valid choices: {list(DATASETS)}")


@dataclass(frozen=True)
class Recipe:
    model_type: str
    model: dict[str, Any]
    data: DataConfig
    trainer: TrainerConfig
    sampling: SamplerConfig | None


def load_recipe(path: str | Path) -> Recipe:
    """Parse a recipe file; errors name the file and the valid settings."""
    path = Path(path)
    raw = _read_with_base(path, seen=())
    unknown = sorted(set(raw) - {"model", "data", "trainer", "sampling"})
    if unknown:
        raise ValueError(f"{path}: unknown table(s) {unknown}; valid tables: ['data', 'model', 'sampling', 'trainer']")
    try:
        model = dict(raw.get("model", {}))
        model_type = model.pop("type", "resnet")
        if model_type not in ("resnet", "mlp"):
            raise ValueError(f"unknown model type {model_type!r}; valid choices: ['mlp', 'resnet']")
        data = config_from_dict(DataConfig, raw.get("data", {}))
        trainer = config_from_dict(TrainerConfig, raw.get("trainer", {}))
        sampling = config_from_dict(SamplerConfig, raw["sampling"]) if "sampling" in raw else None
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: {err}") from err
    return Recipe(model_type, model, data, trainer, sampling)


def _read_with_base(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"no recipe at {path}")
    if path.resolve() in seen:
        raise ValueError(f"recipe base cycle: {' -> '.join(str(p) for p in (*seen, path))}")
    raw = tomllib.loads(path.read_text())
    base = raw.pop("base", None)
    if base is None:
        return raw
    return _merge(_read_with_base(path.parent / base, (*seen, path.resolve())), raw)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def build_dataset(cfg: DataConfig) -> ImageDataset | torch.Tensor:
    """The recipe's data, restricted to the conditioning attributes."""
    if cfg.dataset == "toy2d":
        return sample_toy(cfg.density, cfg.n, torch.Generator().manual_seed(cfg.seed))
    if cfg.dataset == "shapes":
        ds = shapes(cfg.n, cfg.size, cfg.seed, holdout=cfg.holdout)
    elif cfg.dataset == "digits":
        ds = digits(cfg.size, cfg.channels)
    elif cfg.dataset == "folder":
        if cfg.root is None:
            raise ValueError("dataset 'folder' needs data.root")
        kwargs = {"attributes": cfg.folder_attributes} if cfg.folder_attributes else {}
        ds = attribute_folder(cfg.root, cfg.attribute_file, image_size=cfg.size, **kwargs)
    else:
        if cfg.root is None:
            raise ValueError("dataset 'cifar10' needs data.root")
        ds = cifar10(cfg.root)
    return ds.select_attributes(cfg.attributes)


def build_model(recipe: Recipe, data: ImageDataset | torch.Tensor) -> Energy:
    """The recipe's energy network, conditioned on the data's selected attributes.

    The initial weights are drawn from ``trainer.seed`` (without touching the global RNG), so
    one recipe always starts from the same network.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.trainer.seed)
        return _build_model(recipe, data)


def _build_model(recipe: Recipe, data: ImageDataset | torch.Tensor) -> Energy:
    settings = dict(recipe.model)
    if recipe.model_type == "mlp":
        config = config_from_dict(MLPConfig, settings)
        model: Energy = MLPEnergy(config)
    else:
        preset = settings.pop("preset", None)
        presets = {"paper_32": ResNetConfig.paper_32, "paper_128": ResNetConfig.paper_128}
        if preset is not None and preset not in presets:
            raise ValueError(f"unknown preset {preset!r}; valid choices: {sorted(presets)}")
        base = presets[preset]() if preset else ResNetConfig()
        overrides = config_from_dict(ResNetConfig, {**base.to_dict(), **settings})
        attributes = data.attributes if isinstance(data, ImageDataset) else {}
        config = dataclasses.replace(overrides, attributes=dict(attributes))
        if isinstance(data, ImageDataset):
            c, h = data.images.shape[1], data.images.shape[2]
            config = dataclasses.replace(config, in_channels=c, image_size=h)
        model = ResNetEnergy(config)
    if recipe.sampling is not None:
        model.sampler_config = recipe.sampling
    return model
