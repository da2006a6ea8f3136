"""Where models come from and go: the bundled models, model folders and the Hugging Face Hub; loading, saving with
a model's sampling defaults and card, listing and publishing.

A model is named by a folder, a bundled short name, or ``org/name[@revision]`` on the Hub, which `composable_ebm.hub`
finds in the local cache or downloads. The folder's format and its checks are `composable_ebm.persistence`'s; this
layer adds what a folder means to the rest of the toolkit: the sampling defaults an energy was trained for
(``config.json``'s ``"sampler"``, a `SamplingDefaults`), the card it was published with, and the sources.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from composable_ebm.configs import MAX_CONFIG_BYTES
from composable_ebm.energy import Energy, NoiseConditioned
from composable_ebm.errors import CebmError, InvalidInputError, ModelFileError, ModelNotFoundError, NonFiniteError
from composable_ebm.folders import CARD_NAME, CONFIG_NAME
from composable_ebm.hub import (
    cached_models,
    check_target,
    hub_snapshot,
    is_repo_id,
    looks_local,
    model_files,
    split_revision,
    upload_folder,
)
from composable_ebm.latent import LatentSpace
from composable_ebm.model_cards import model_card
from composable_ebm.model_types import model_class
from composable_ebm.persistence import (
    model_payload as network_payload,
    network_config,
    read_config,
    read_model,
    recover_folder,
    write_model,
)
from composable_ebm.sampling import SamplingDefaults

__all__ = [
    "BUNDLED_DIR", "bundled_models", "from_pretrained", "list_models", "load_latent_space", "load_model",
    "model_from_payload",
    "model_payload", "push_folder", "push_to_hub", "resolve_source", "sampling_defaults", "save_model",
    "save_pretrained",
]

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
P = TypeVar("P")


def sampling_defaults(payload: dict[str, Any], path: Path) -> SamplingDefaults | None:
    """The sampling defaults a ``config.json`` payload (read from ``path``) holds, of its model's family (a
    noise-conditioned model's are a ladder's); None when it holds none."""
    if payload.get("sampler") is None:
        return None
    ladder = issubclass(model_class(payload["model_type"]), NoiseConditioned)
    try:
        return SamplingDefaults.from_flat(payload["sampler"], ladder=ladder, saved=True)
    except InvalidInputError as err:
        raise ModelFileError(f"{path}: {err}") from err


def typed_configs(folder: Path, payload: dict[str, Any],
                  path: Path | None = None) -> tuple[Any, SamplingDefaults | None]:
    """The network config and sampling defaults of a ``config.json`` payload, type- and range-checked."""
    path = path or folder / CONFIG_NAME
    return network_config(payload, path), sampling_defaults(payload, path)


def model_payload(model: nn.Module) -> dict[str, Any]:
    """What ``config.json`` holds for ``model``: its type, config, version and (energies) sampling defaults, which
    must be of its family."""
    payload = network_payload(model)
    if isinstance(model, Energy):
        defaults = model.sampling_defaults
        if defaults is not None and defaults.sampler.noise_levels != isinstance(model, NoiseConditioned):
            wanted = "a LadderConfig" if isinstance(model, NoiseConditioned) else "a SamplerConfig"
            raise InvalidInputError(f"{model.name}'s sampling_defaults hold a {type(defaults.sampler).__name__}, which"
                                    f" its family does not sample with; valid choices: {wanted}")
        payload["sampler"] = defaults.to_flat() if defaults is not None else None
    return payload


def model_from_payload(path: Path) -> nn.Module:
    """A freshly initialised model as the ``config.json``-format file at ``path`` describes it (no weights read)."""
    payload = read_config(path.parent, path)
    config, sampler = typed_configs(path.parent, payload, path)
    try:
        model = model_class(payload["model_type"])(config)
    except ValueError as err:
        raise ModelFileError(f"{path}: {err}") from err
    if isinstance(model, Energy):
        model.sampling_defaults = sampler
    return model


def save_model(model: nn.Module, folder: str | Path, card: str | None = None, extra: dict[str, Any] | None = None,
               *, overwrite: bool = True) -> Path:
    """Save ``model`` as a folder: ``config.json`` (`model_payload`, and ``extra``), ``model.safetensors`` and, if
    given, its card as ``README.md``; replaced whole or not at all (`composable_ebm.persistence.write_model`)."""
    payload = model_payload(model)
    if extra:
        payload["extra"] = extra
    return write_model(model, folder, payload, card, overwrite=overwrite)


def save_pretrained(model: nn.Module, folder: str | Path, card: str | None = None) -> Path:
    """`save_model` with a card: the given one, the one the model was loaded with, or a generated one."""
    if card is None:
        card = getattr(model, "card", None) or model_card(model, location=str(folder))
    return save_model(model, folder, card=card)


def load_model(source: str | Path, device: torch.device | str = "cpu", revision: str | None = None,
               refresh: bool = False, *, force_download: bool = False, local_files_only: bool = False,
               token: str | bool | None = None, cache_dir: str | Path | None = None) -> nn.Module:
    """Load a saved model from a folder, a bundled short name, or the Hugging Face Hub as ``"org/name"``.

    Everything is checked before the network is built (see the module docstring); weights are
    matched strictly. Errors are `CebmError` with one line that names the file.

    The Hub options mean what they mean in huggingface_hub: ``force_download`` asks the Hub for the
    newest revision and downloads again even when the model is cached (``refresh`` is the same),
    ``local_files_only`` never uses the network, ``token`` authenticates (default: ``HF_TOKEN`` or the
    saved login), ``cache_dir`` replaces the Hub cache folder.
    """
    folder = resolve_source(source, revision, refresh or force_download, local_files_only=local_files_only,
                            token=token, cache_dir=cache_dir)
    try:
        return _load_folder(folder, device)
    except (ModelFileError, NonFiniteError) as err:
        if not isinstance(source, Path) and is_repo_id(split_revision(str(source), revision)[0]) and \
                not looks_local(str(source)):  # a damaged cached download: say how to fetch it again
            raise type(err)(f"{err} (a cached download: --refresh, or refresh=True, downloads it again)") from err
        raise


def _load_folder(folder: Path, device: torch.device | str) -> nn.Module:
    """A resolved model folder loaded (`composable_ebm.persistence.read_model`), with its sampling defaults and the
    card it was published with."""
    model, payload = read_model(folder, device)
    sampler = sampling_defaults(payload, folder / CONFIG_NAME)
    card = folder / CARD_NAME
    if card.is_file() and not card.is_symlink() and card.stat().st_size <= MAX_CONFIG_BYTES:
        model.card = card.read_text(encoding="utf-8", errors="replace")  # a push keeps it (license, results)
    if isinstance(model, Energy):
        model.sampling_defaults = sampler
        if model.latent_source is not None:
            space = load_latent_space(model.latent_source, folder, device, named_by=model.name)
            if space.latent_shape != model.input_shape:
                raise ModelFileError(f"{folder}: {model.name} takes inputs of shape {model.input_shape}, but its"
                                     f" autoencoder {space} makes latents of shape {space.latent_shape}")
            trained = model.latent_fingerprint
            if trained is not None and trained != space.fingerprint:
                raise ModelFileError(f"{folder}: {model.name} was trained over the latents of another autoencoder than"
                                     f" the {space} found now (fingerprint {trained[:12]}, found"
                                     f" {space.fingerprint[:12]}): name the one it was trained with, or retrain it")
            model.latent_space = space
    return model


def load_latent_space(source: str, relative_to: Path | None = None, device: torch.device | str = "cpu",
                      named_by: str = "the model") -> LatentSpace:
    """The latent space of the autoencoder ``source`` names: a folder relative to ``relative_to`` (the naming model's
    folder) when one is there, else a bundled name, a Hub id or a folder, as `load_model` takes them. An autoencoder
    that is missing, corrupt or not an autoencoder is one line naming ``named_by`` and ``source``."""
    local = relative_to / source if relative_to is not None and not Path(source).is_absolute() else None
    try:
        with torch.device("cpu"):  # read whole whatever default device the caller set (a meta skeleton's, say)
            autoencoder = load_model(local if local is not None and local.is_dir() else source, device)
    except CebmError as err:
        raise type(err)(f"{named_by} is over the latents of {source!r}, which did not load: {err}") from err
    if not isinstance(autoencoder, model_class("autoencoder")):
        raise ModelFileError(f"{named_by} names {source!r} as its autoencoder, but that is a"
                             f" {type(autoencoder).__name__} model, not an autoencoder (cebm train-autoencoder)")
    return LatentSpace(autoencoder, source)


def bundled_models() -> list[str]:
    """Short names of the models shipped inside the package (``load("shapes-color")``)."""
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / CONFIG_NAME).is_file())


def list_models() -> list[dict[str, Any]]:
    """The models `load_model` finds without a download: the bundled short names, then the
    composable_ebm models in the local Hub cache (``org/name``, or ``org/name@rev`` for a revision other
    than main), each ``{"name", "source", "type", "attributes"}``. A cached model whose ``config.json``
    cannot be read is listed with an ``"error"`` instead of being left out."""
    rows = [{"name": name, "source": "bundled", **_summary(BUNDLED_DIR / name)} for name in bundled_models()]
    rows += [{"name": name, "source": f"hub cache ({snapshot})", **_summary(snapshot)} for name, snapshot in cached_models()]
    return rows


def _summary(folder: Path) -> dict[str, Any]:
    try:
        payload = read_config(folder)
    except (ModelFileError, ModelNotFoundError) as err:
        return {"type": None, "attributes": {}, "error": str(err)}
    attributes = payload["config"].get("attributes", {}) if isinstance(payload.get("config"), dict) else {}
    return {"type": payload["model_type"], "attributes": {a: list(v) for a, v in attributes.items()}}


def resolve_source(source: str | Path, revision: str | None = None, refresh: bool = False, *,
                   local_files_only: bool = False, token: str | bool | None = None,
                   cache_dir: str | Path | None = None) -> Path:
    """The folder of a model: a local folder as is; a bundled model's short name; ``"org/name"`` from
    the local Hub cache, or downloaded when not cached (or when ``refresh``; see `load_model`)."""
    text = str(source)
    if not isinstance(source, Path):
        text, revision = split_revision(text, revision)
    if isinstance(source, Path) or looks_local(text):
        if revision is not None:
            raise InvalidInputError(f"{text} is a local folder, which has no revisions (got {revision!r}); revisions"
                                    " name Hub models, org/name@revision")
        path = Path(text).expanduser()
        recover_folder(path)  # a save that died between its renames leaves the old folder beside
        if not path.is_dir():
            raise ModelNotFoundError(f"no model folder at {path}")
        return path
    if text in bundled_models():
        if revision is not None:
            raise InvalidInputError(f"{text} is a bundled model, which has one version (got revision {revision!r});"
                                    " revisions name Hub models, org/name@revision")
        return BUNDLED_DIR / text
    if is_repo_id(text):
        return hub_snapshot(text, revision, refresh, local_files_only, token, cache_dir)
    raise ModelNotFoundError(
        f"'{text}' is neither a model folder, a bundled model ({', '.join(bundled_models()) or 'none installed'})"
        " nor a Hub repository id ('org/name')"
    )


def push_folder(folder: str | Path, repo_id: str, revision: str | None = None, private: bool = False,
                token: str | None = None, commit_message: str | None = None) -> str:
    """Publish a saved model folder, checked by loading it first (never publish what would not load);
    returns the commit's URL. See `composable_ebm.hub.upload_folder`."""
    check_target(repo_id, revision)  # before the load: a bad name is refused at once
    model_files(Path(folder))  # links and non-files refused before anything is read
    _check_portable(load_model(Path(folder)), Path(folder))
    return upload_folder(folder, repo_id, revision, private, token, commit_message)


def _check_portable(model: nn.Module, folder: Path) -> None:
    """One line when a latent model names its autoencoder by a folder of this machine: on the Hub it would not load."""
    source = model.latent_source if isinstance(model, Energy) else None
    if source is None or source in bundled_models():
        return
    if (folder / source).is_dir() or looks_local(source) or not is_repo_id(split_revision(source, None)[0]):
        raise InvalidInputError(f"{folder} names its autoencoder by the folder {source!r}, which would not load from"
                                " the Hub: push the autoencoder first (cebm push FOLDER ORG/NAME) and train with"
                                " [model] autoencoder = \"ORG/NAME\"")


def push_to_hub(model: nn.Module, repo_id: str, revision: str | None = None, private: bool = False,
                token: str | None = None, commit_message: str | None = None, card: str | None = None) -> str:
    """Publish a model to the Hugging Face Hub as ``config.json``, ``model.safetensors`` and its card.

    Creates the repository (and the branch ``revision``) if needed; the token comes from the usual
    places (``HF_TOKEN``, ``hf auth login``) unless given. Returns the commit's URL.
    """
    with tempfile.TemporaryDirectory() as tmp:
        at = f"{repo_id}@{revision}" if revision and revision != "main" else repo_id
        if card is None:  # the card the model was loaded with, every field kept (its usage line is rewritten)
            card = getattr(model, "card", None) or model_card(model, repo_id=at)
        folder = save_model(model, Path(tmp) / "model", card=card)
        return push_folder(folder, repo_id, revision, private, token, commit_message)


def from_pretrained(cls: type[P], name_or_path: str | Path, revision: str | None = None,
                    device: torch.device | str | None = None, *, token: str | bool | None = None,
                    cache_dir: str | Path | None = None, force_download: bool = False,
                    local_files_only: bool = False, map_location: torch.device | str | None = None,
                    subfolder: str | None = None, **unsupported: Any) -> P:
    """Load a saved model of this class: a folder, a bundled name or ``org/name[@revision]``.

    ``token``, ``cache_dir``, ``force_download``, ``local_files_only``, ``map_location`` (the device, as
    ``device``) and ``subfolder`` (of a local folder) mean what they mean in huggingface_hub's
    ``ModelHubMixin.from_pretrained`` (see `load_model`); any other keyword (``proxies``, say) is one line
    naming the ones taken."""
    if unsupported:
        names = ", ".join(sorted(unsupported))
        advice = " (set HTTPS_PROXY in the environment instead)" if "proxies" in unsupported else ""
        raise InvalidInputError(f"from_pretrained takes no {names}{advice}; it takes revision, device or"
                                " map_location, token, cache_dir, force_download, local_files_only, subfolder")
    if device is not None and map_location is not None and torch.device(device) != torch.device(map_location):
        raise InvalidInputError(f"device={device!r} and map_location={map_location!r} disagree; give one")
    if subfolder:
        if is_repo_id(str(name_or_path)) and not looks_local(str(name_or_path)):
            raise InvalidInputError(f"subfolder={subfolder!r}: a Hub model here is the repository's root files"
                                    " (config.json, model.safetensors); download the repository and load the folder")
        name_or_path = Path(name_or_path) / subfolder
    model = load_model(name_or_path, device=device or map_location or "cpu", revision=revision, token=token,
                       cache_dir=cache_dir, force_download=force_download, local_files_only=local_files_only)
    if not isinstance(model, cls):
        raise TypeError(f"{name_or_path} holds a {type(model).__name__}, not a {cls.__name__}")
    return model
