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

from composable_ebm.configs import MAX_IMAGE_SIZE, check_size, config_from_dict
from composable_ebm.data import ImageDataset, attribute_folder, cifar10, digits, sample_toy, shapes
from composable_ebm.energy import Energy
from composable_ebm.errors import InvalidInputError
from composable_ebm.nets import MLPConfig, MLPEnergy, ResNetConfig, ResNetEnergy
from composable_ebm.sampling import SamplerConfig
from composable_ebm.training import TrainerConfig

DATASETS = ("shapes", "digits", "folder", "cifar10", "toy2d")
PRESETS = {"paper_32": ResNetConfig.paper_32, "paper_128": ResNetConfig.paper_128}


@dataclass(frozen=True)
class DataConfig:
    """Which dataset to build, and which of its attributes the model is conditioned on."""

    dataset: str = "shapes"
    """One of `shapes`, `digits`, `folder`, `cifar10`, `toy2d`."""
    attributes: tuple[str, ...] = ()
    """conditioning attributes; empty: unconditional"""
    n: int = 10000
    """shapes / toy2d: number of items"""
    size: int = 32
    """image size"""
    seed: int = 0
    """Seed of procedural data (shapes, toy2d)."""
    holdout: tuple[dict[str, str], ...] = ()
    """shapes: combinations kept out of training"""
    balance: bool = False
    """shapes: weight the training combinations so every attribute's values are equally frequent despite the
    held-out ones (red circles held out: circles and red 1 in 3 of the images, not 0.25)"""
    channels: int = 1
    """digits: 1 or 3"""
    root: str | None = None
    """folder / cifar10: where the data lives"""
    attribute_file: str = "list_attr_celeba.txt"
    """folder: CelebA-format table"""
    folder_attributes: dict[str, str] = field(default_factory=dict)
    """folder: ours -> column ("-Col" negates)"""
    density: str = "8gaussians"
    """toy2d"""

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise InvalidInputError(f"unknown dataset {self.dataset!r}; valid choices: {list(DATASETS)}")
        check_size("DataConfig", "n", self.n, high=1 << 26)
        check_size("DataConfig", "size", self.size, low=4, high=MAX_IMAGE_SIZE)
        if self.channels not in (1, 3):
            raise InvalidInputError(f"DataConfig.channels must be 1 or 3, got {self.channels!r}")
        if self.balance and self.dataset != "shapes":
            raise InvalidInputError(f"DataConfig.balance applies to the shapes dataset only, not {self.dataset!r};"
                                    " valid choices: balance = false, or dataset = \"shapes\"")


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
        raise InvalidInputError(f"{path}: unknown table(s) {unknown}; valid tables: ['data', 'model', 'sampling', 'trainer']")
    try:
        for table in ("model", "data", "trainer", "sampling"):
            if table in raw and not isinstance(raw[table], dict):
                raise InvalidInputError(f"[{table}] must be a table of settings, got {type(raw[table]).__name__}")
        model = dict(raw.get("model", {}))
        model_type = model.pop("type", "resnet")
        if model_type not in ("resnet", "mlp"):
            raise InvalidInputError(f"unknown model type {model_type!r}; valid choices: ['mlp', 'resnet']")
        data = config_from_dict(DataConfig, raw.get("data", {}))
        trainer = config_from_dict(TrainerConfig, raw.get("trainer", {}))
        sampling = config_from_dict(SamplerConfig, raw["sampling"]) if "sampling" in raw else None
        _model_config(model_type, model)  # checked now, before any data is built
        kept = sampling.augment_preserves if sampling is not None else None
        foreign = sorted(set(kept or ()) - set(data.attributes))
        if foreign:
            raise InvalidInputError(f"[sampling] augment_preserves names {foreign}, not attributes of this model;"
                                    f" valid choices: {sorted(data.attributes)}")
    except (ValueError, TypeError) as err:
        raise InvalidInputError(f"{path}: {err}") from err
    return Recipe(model_type, model, data, trainer, sampling)


def _model_config(model_type: str, settings: dict[str, Any]) -> MLPConfig | ResNetConfig:
    """The typed, range-checked config of a recipe's [model] table (a ResNet's preset, then its overrides)."""
    settings = dict(settings)
    if model_type == "mlp":
        return config_from_dict(MLPConfig, settings)
    if "preset" not in settings and "blocks" not in settings:
        raise InvalidInputError(f"the recipe's [model] table names no network: give a preset (one of {sorted(PRESETS)})"
                                " or a blocks table (see recipes/shapes-base.toml)")
    preset = settings.pop("preset", None)
    if preset is not None and preset not in PRESETS:
        raise InvalidInputError(f"unknown preset {preset!r}; valid choices: {sorted(PRESETS)}")
    base = PRESETS[preset]() if preset else ResNetConfig()
    return config_from_dict(ResNetConfig, {**base.to_dict(), **settings})


def _read_with_base(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"no recipe at {path}")
    if path.resolve() in seen:
        raise InvalidInputError(f"recipe base cycle: {' -> '.join(str(p) for p in (*seen, path))}")
    try:
        raw = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise InvalidInputError(f"{path}: not a TOML file ({err})") from err
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise InvalidInputError(f"{path}: base must be a string (a recipe path), got {type(base).__name__}")
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
        ds = shapes(cfg.n, cfg.size, cfg.seed, holdout=cfg.holdout, balance=cfg.balance)
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
    config = _model_config(recipe.model_type, recipe.model)
    if isinstance(config, MLPConfig):
        model: Energy = MLPEnergy(config)
    else:
        attributes = data.attributes if isinstance(data, ImageDataset) else {}
        config = dataclasses.replace(config, attributes=dict(attributes),
                                     null_condition=bool(attributes) and recipe.trainer.label_dropout > 0)
        if isinstance(data, ImageDataset):
            c, h = data.images.shape[1], data.images.shape[2]
            config = dataclasses.replace(config, in_channels=c, image_size=h)
        model = ResNetEnergy(config)
    if recipe.sampling is not None:
        model.sampler_config = recipe.sampling
    return model
