"""Training recipes: TOML files parsed at the edge into the typed configs.

A recipe has four tables::

    [model]      # type = a registered network (`network_names`: "resnet" (default), "mlp", "denoising-unet");
                 # preset = one of its presets;
                 # any field of its config
    [data]       # dataset = a registered dataset (`DATASETS`: "shapes", "digits", "folder", "cifar10", "toy2d"), that
                 # dataset's settings, and attributes = what the model conditions on
    [trainer]    # TrainerConfig fields and its objective's: ContrastiveConfig's (with [trainer.sampler] and
                 # [trainer.chain_augment] sub-tables), or DenoisingConfig's for a noise-conditioned network
    [sampling]   # the model's sampling defaults (SamplingDefaults: SamplerConfig fields, or LadderConfig fields for a
                 # noise-conditioned network; guidance_scale, guidance_interval, guided_alone, augment_preserves),
                 # saved with it; [sampling.augment]; [sampling.alone] (the fields that change when the model is
                 # sampled on its own)

A recipe may start from another with ``base = "other.toml"`` (a path relative to the recipe):
its tables are merged key by key, the recipe's own values winning. Optional tables
(``trainer.chain_augment``, ``sampling.augment``) are switched off with ``= false``.
Unknown keys anywhere are an error naming the valid ones. Relative data paths (``data.root``) start at the
recipe's folder. A recipe whose chain of files gives no ``[trainer] seed`` gets one from its model's name, so two
recipes never start from the same weights by accident.

``load_recipe(path, settings=["trainer.batch_size=512"])`` (``cebm train --set``) changes single settings over the
file's, as a last layer on top of it and its bases.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tomllib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from composable_ebm.atomic import write_atomic
from composable_ebm.configs import config_from_dict
from composable_ebm.data import DATASETS, DataConfig, ImageDataset
from composable_ebm.energy import Energy, NoiseConditioned
from composable_ebm.errors import InvalidInputError
from composable_ebm.model_types import network_class, network_names
from composable_ebm.sampling import SamplingDefaults
from composable_ebm.training import TrainerConfig


@dataclass(frozen=True)
class Recipe:
    """A parsed recipe: the network's type and settings, the data, the trainer and the sampling defaults."""

    model_type: str
    model: dict[str, Any]
    data: DataConfig
    trainer: TrainerConfig
    sampling: SamplingDefaults | None
    folder: Path | None = None  # the recipe's folder: relative data paths start here


def recipe_seed(name: str) -> int:
    """The seed a recipe without one gets: a stable hash of its model's name."""
    return zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF


TABLES = ("model", "data", "trainer", "sampling")


def parse_setting(item: str) -> dict[str, Any]:
    """``TABLE.KEY=VALUE`` as the nested table it sets, ``{TABLE: {KEY: VALUE}}`` (a dotted key goes deeper:
    ``trainer.sampler.steps=40``). VALUE is read as TOML (``512``, ``3e-4``, ``true``, ``[1, 2]``); a bare word
    that is not TOML is a string (``trainer.precision=float32``)."""
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) < 2 or not all(parts) or parts[0] not in TABLES or not text.strip():
        raise InvalidInputError(f"--set {item!r}: write TABLE.KEY=VALUE with TABLE one of {list(TABLES)}"
                                " (e.g. trainer.batch_size=512)")
    try:
        value = tomllib.loads(f"value = {text.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    table: dict[str, Any] = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        table = {part: table}
    return table


def load_recipe(path: str | Path, settings: Sequence[str] = ()) -> Recipe:
    """Parse a recipe file, with ``settings`` (``TABLE.KEY=VALUE`` each, see `parse_setting`) over its own; errors
    name the file and the valid settings."""
    path = Path(path)
    raw = _read_with_base(path, seen=())
    for item in settings:
        raw = _merge(raw, parse_setting(item))
    unknown = sorted(set(raw) - set(TABLES))
    if unknown:
        raise InvalidInputError(f"{path}: unknown table(s) {unknown}; valid tables: {sorted(TABLES)}")
    try:
        for table in TABLES:
            if table in raw and not isinstance(raw[table], dict):
                raise InvalidInputError(f"[{table}] must be a table of settings, got {type(raw[table]).__name__}")
        model = dict(raw.get("model", {}))
        model_type = model.pop("type", "resnet")
        if not isinstance(model_type, str):
            raise InvalidInputError(f"[model] type must be a network name; valid choices: {network_names()}")
        network = network_class(model_type, "[model] ")
        data = data_config(raw.get("data", {}))
        trainer_table = dict(raw.get("trainer", {}))
        if "seed" not in trainer_table:
            trainer_table["seed"] = recipe_seed(str(model.get("name", path.stem)))
        noised = issubclass(network, NoiseConditioned)  # the model's family: its objective and its sampler
        trainer = TrainerConfig.from_flat(trainer_table, denoising=noised).for_model(noised)
        sampling = SamplingDefaults.from_flat(raw["sampling"], ladder=noised) if "sampling" in raw else None
        model_config(model_type, model)  # checked now, before any data is built
        kept = sampling.augment_preserves if sampling is not None else None
        foreign = sorted(set(kept or ()) - set(data.attributes))
        if foreign:
            raise InvalidInputError(f"[sampling] augment_preserves names {foreign}, not attributes of this model;"
                                    f" valid choices: {sorted(data.attributes)}")
    except (ValueError, TypeError) as err:
        raise InvalidInputError(f"{path}: {err}") from err
    return Recipe(model_type, model, data, trainer, sampling, path.resolve().parent)


def data_config(table: dict[str, Any]) -> DataConfig:
    """The typed settings of a ``[data]`` table: the class its ``dataset`` names (default ``shapes``)."""
    table = dict(table)
    name = table.pop("dataset", "shapes")
    if not isinstance(name, str):
        raise InvalidInputError(f"[data] dataset must be a dataset name; valid choices: {DATASETS.names()}")
    return config_from_dict(DATASETS.get(name, "[data] "), table)


def model_config(model_type: str, settings: dict[str, Any]) -> Any:
    """The typed, range-checked config of a recipe's [model] table (a preset, then its overrides)."""
    cls = network_class(model_type, "[model] ")
    settings = dict(settings)
    presets = getattr(cls, "presets", {})
    preset = settings.pop("preset", None)
    if preset is not None and preset not in presets:
        raise InvalidInputError(f"unknown preset {preset!r} for {model_type}; valid choices: {sorted(presets)}")
    if presets and preset is None and "blocks" not in settings:
        raise InvalidInputError(f"the recipe's [model] table names no network: give a preset (one of {sorted(presets)})"
                                " or a blocks table (see recipes/shapes-base.toml)")
    base = presets[preset]().to_dict() if preset else {}
    return config_from_dict(cls.config_class, {**base, **settings})


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


def build_dataset(cfg: DataConfig, base: Path | None = None) -> ImageDataset | torch.Tensor:
    """The recipe's data, restricted to the conditioning attributes; relative paths start at ``base``."""
    data = cfg.build(base)
    return data.select_attributes(cfg.attributes) if isinstance(data, ImageDataset) else data


def recipe_latent_space(recipe: Recipe) -> Any:
    """The `composable_ebm.latent.LatentSpace` of the autoencoder the recipe's ``[model] autoencoder`` names (a
    folder relative to the recipe's, a bundled name or a Hub id), or None for a model over pixels."""
    from composable_ebm.models import load_latent_space

    source = recipe.model.get("autoencoder")
    if source is None:
        return None
    name = recipe.model.get("name")
    return load_latent_space(str(source), recipe.folder, named_by=f"the recipe's model {name!r}" if name else
                             "the recipe's model")


def encode_dataset(data: ImageDataset, space: Any, cache: Path | None = None) -> ImageDataset:
    """The dataset with each image replaced by its standardised latent (float32): what a latent energy trains on.
    With a ``cache`` folder the latents are kept there, named by a digest of the autoencoder and the images, so the
    same images encoded by the same autoencoder (another attribute's run, a resumed one) are read, not encoded."""
    if tuple(data.images.shape[1:]) != space.image_shape:
        raise InvalidInputError(f"the data's images have shape {tuple(data.images.shape[1:])}; the autoencoder"
                                f" {space} encodes {space.image_shape}: give the data that size (e.g. [data] size)")
    path = None
    if cache is not None:
        digest = hashlib.sha256(space.fingerprint.encode("utf-8"))
        digest.update(str((data.images.dtype, tuple(data.images.shape))).encode("utf-8"))
        digest.update(data.images.contiguous().numpy().tobytes())
        path = cache / f"latents-{digest.hexdigest()[:24]}.safetensors"
    if path is not None and path.is_file():
        latents = load_file(path)["latents"]
    else:
        latents = space.encode(data.images)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, lambda tmp: save_file({"latents": latents.contiguous()}, tmp))
    return ImageDataset(latents, dict(data.labels), dict(data.attributes), data.name,
                        {**data.info, "autoencoder": str(space), "autoencoder_fingerprint": space.fingerprint})


def build_model(recipe: Recipe, data: ImageDataset | torch.Tensor) -> Energy:
    """The recipe's energy network, conditioned on the data's selected attributes.

    The initial weights are drawn from ``trainer.seed`` (without touching the global RNG), so
    one recipe always starts from the same network.
    """
    if isinstance(data, ImageDataset):
        return _seeded_model(recipe, dict(data.attributes), tuple(data.images.shape[1:]),
                             data.info.get("autoencoder_fingerprint"))
    return _seeded_model(recipe, None, None)


def build_model_from_shapes(recipe: Recipe) -> Energy:
    """The recipe's network with its input shape and attributes read from the data's description
    (`DataConfig.describe`: no images decoded), for reading a checkpoint."""
    attributes, shape = recipe.data.describe(recipe.folder)
    space = recipe_latent_space(recipe)
    model = _seeded_model(recipe, {a: attributes[a] for a in recipe.data.attributes},
                          shape if space is None else space.latent_shape, None if space is None else space.fingerprint)
    model.latent_space = space
    return model


def _seeded_model(recipe: Recipe, attributes: dict[str, tuple[str, ...]] | None,
                  shape: tuple[int, ...] | None, fingerprint: str | None = None) -> Energy:
    """The network, its weights drawn from ``trainer.seed`` in a forked RNG (the global one is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.trainer.seed)
        return _build_model(recipe, attributes, shape, fingerprint)


def _build_model(recipe: Recipe, attributes: dict[str, tuple[str, ...]] | None,
                 shape: tuple[int, ...] | None, fingerprint: str | None = None) -> Energy:
    """The network with the config fields the data decides (where the config has them): attributes, the null
    condition (label dropout), input channels and image size."""
    cls = network_class(recipe.model_type)
    config = model_config(recipe.model_type, recipe.model)
    fields = {f.name for f in dataclasses.fields(config)}
    decided: dict[str, Any] = {}
    if attributes is not None and shape is not None and len(shape) == 3:
        decided.update(attributes=dict(attributes), null_condition=bool(attributes) and recipe.trainer.label_dropout > 0,
                       in_channels=shape[0], image_size=shape[1])
    source = recipe.model.get("autoencoder")
    if source is not None and recipe.folder is not None and (recipe.folder / str(source)).is_dir():
        decided["autoencoder"] = str((recipe.folder / str(source)).resolve())  # a folder, named from anywhere
    if fingerprint is not None:
        decided["autoencoder_fingerprint"] = fingerprint  # the latents it learns: a changed autoencoder is refused
    config = dataclasses.replace(config, **{k: v for k, v in decided.items() if k in fields})
    model = cls(config)
    model.sampling_defaults = recipe.sampling
    return model
