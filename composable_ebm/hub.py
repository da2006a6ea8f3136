"""Save and load models as ``config.json`` + ``model.safetensors`` (strict, nothing pickled).

``config.json`` holds the model type, its typed config and, for energies, the default
sampler settings, so ``load(...).sample(n)`` uses the settings the model was trained for.

Saving replaces a model folder whole or not at all: the new folder is written beside the old
one (``.NAME.new-PID-*``) and swapped in by two renames; if a process dies between them, the next
save or load puts the old folder back. Loading checks everything it can before allocating: the
config's types and sizes (no layer wider than :data:`~composable_ebm.configs.MAX_WIDTH`), then the
weights file's header against the network the config describes (built on the ``meta`` device,
at most :data:`MAX_PARAMETERS` elements), then that every weight is finite.

Hub names (``org/name``) load from the local cache without touching the network; only an
uncached model (or ``refresh=True``) is downloaded, and a Hub that does not answer fails after
about twice :func:`hub_timeout` (``CEBM_HUB_TIMEOUT``, default 5 s) plus a second.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from composable_ebm import __version__
from composable_ebm.atomic import fsync_file, pid_alive, shared_mode
from composable_ebm.configs import config_from_dict, config_to_dict
from composable_ebm.energy import Energy
from composable_ebm.errors import (
    HubUnavailableError,
    InvalidInputError,
    ModelFileError,
    ModelNotFoundError,
    NonFiniteError,
)
from composable_ebm.evaluation.classifier import AttributeClassifier, ClassifierConfig
from composable_ebm.nets import MLPConfig, MLPEnergy, ResNetConfig, ResNetEnergy
from composable_ebm.sampling import SamplerConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CARD_NAME = "README.md"
CONFIG_KEYS = ("model_type", "config", "composable_ebm_version", "sampler", "extra")
"""The keys a ``config.json`` may hold; any other is an error."""

MAX_PARAMETERS = 1_000_000_000
"""Most weight elements a loaded model may have (4 GB in float32)."""
MAX_CONFIG_BYTES = 1_000_000
"""Largest ``config.json`` read."""

MODEL_TYPES: dict[str, tuple[type, type]] = {
    "resnet_energy": (ResNetConfig, ResNetEnergy),
    "mlp_energy": (MLPConfig, MLPEnergy),
    "attribute_classifier": (ClassifierConfig, AttributeClassifier),
}
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


def _model_type(model: nn.Module) -> str:
    for name, (_, cls) in MODEL_TYPES.items():
        if type(model) is cls:
            return name
    raise TypeError(f"cannot save a {type(model).__name__}; savable types: {sorted(c.__name__ for _, c in MODEL_TYPES.values())}")


def save_model(model: nn.Module, folder: str | Path, card: str | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Write ``config.json``, ``model.safetensors`` (and ``README.md`` if a model card is given).

    The folder is replaced whole: other files in it are carried over, and a failure at any
    point leaves the previous folder as it was.
    """
    folder = Path(folder)
    payload: dict[str, Any] = {
        "model_type": _model_type(model),
        "config": config_to_dict(model.config),
        "composable_ebm_version": __version__,
    }
    if isinstance(model, Energy):
        sampler = model.sampler_config
        payload["sampler"] = config_to_dict(sampler) if sampler is not None else None
    if extra:
        payload["extra"] = extra
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    folder.parent.mkdir(parents=True, exist_ok=True)
    recover_folder(folder)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.new-{os.getpid()}-"))
    try:
        os.chmod(staging, shared_mode(directory=True))
        save_file(state, staging / WEIGHTS_NAME, metadata={"format": "pt"})
        (staging / CONFIG_NAME).write_text(json.dumps(payload, indent=2) + "\n")
        if card is not None:
            (staging / CARD_NAME).write_text(card)
        ours = {WEIGHTS_NAME, CONFIG_NAME} | ({CARD_NAME} if card is not None else set())
        if folder.is_dir():
            for item in folder.iterdir():
                if item.name not in ours:
                    copy = shutil.copytree if item.is_dir() and not item.is_symlink() else shutil.copy2
                    copy(item, staging / item.name)
        for name in ours:  # safetensors writes 0600; a model folder is for sharing
            os.chmod(staging / name, shared_mode())
            fsync_file(staging / name)
        _swap_in(staging, folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return folder


def _swap_in(staging: Path, folder: Path) -> None:
    if not folder.exists():
        os.rename(staging, folder)
        return
    if not folder.is_dir():
        raise InvalidInputError(f"{folder} exists and is not a folder; a model is saved as a folder")
    old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old-{os.getpid()}-"))
    os.rmdir(old)
    os.rename(folder, old)
    try:
        os.rename(staging, folder)  # a kill before this line is undone by recover_folder
    except BaseException:
        os.rename(old, folder)
        raise
    shutil.rmtree(old)


def recover_folder(folder: str | Path) -> None:
    """Undo a save that died between its two renames (the old folder is put back), and remove
    the staging folders of saves whose process is gone."""
    folder = Path(folder)
    if not folder.parent.is_dir():
        return
    pattern = re.compile(rf"^\.{re.escape(folder.name)}\.(new|old)-(\d+)-")
    leftovers = []
    for item in folder.parent.iterdir():
        m = pattern.match(item.name)
        if m and item.is_dir() and not pid_alive(int(m.group(2))):
            leftovers.append((m.group(1), item))
    olds = sorted((p for kind, p in leftovers if kind == "old"), key=lambda p: p.stat().st_mtime)
    if not folder.exists() and olds:
        os.rename(olds.pop(), folder)
    for _, item in leftovers:
        if item.exists():
            shutil.rmtree(item)


def read_config(folder: str | Path) -> dict[str, Any]:
    """The checked contents of ``folder/config.json``: a JSON object with only :data:`CONFIG_KEYS`."""
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise ModelNotFoundError(f"{folder} has no {CONFIG_NAME}; a model folder holds {CONFIG_NAME} and {WEIGHTS_NAME}")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ModelFileError(f"{path}: {path.stat().st_size} bytes; a {CONFIG_NAME} is at most {MAX_CONFIG_BYTES}")
    try:
        payload = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelFileError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(payload, dict):
        raise ModelFileError(f"{path}: must hold a JSON object, got {type(payload).__name__}")
    unknown = sorted(set(payload) - set(CONFIG_KEYS))
    if unknown:
        raise ModelFileError(f"{path}: unknown key(s) {unknown}; valid keys: {list(CONFIG_KEYS)}")
    for key in ("model_type", "config"):
        if key not in payload:
            raise ModelFileError(f"{path}: missing {key!r}; a {CONFIG_NAME} holds {list(CONFIG_KEYS)}")
    if not isinstance(payload["model_type"], str) or payload["model_type"] not in MODEL_TYPES:
        raise ModelFileError(f"{path}: unknown model_type {payload['model_type']!r}; known types: {sorted(MODEL_TYPES)}")
    return payload


def typed_configs(folder: Path, payload: dict[str, Any]) -> tuple[Any, SamplerConfig | None]:
    """The network config and sampler settings of a ``config.json`` payload, type- and range-checked."""
    config_cls, _ = MODEL_TYPES[payload["model_type"]]
    try:
        config = config_from_dict(config_cls, payload["config"])
        sampler = config_from_dict(SamplerConfig, payload["sampler"]) if payload.get("sampler") is not None else None
    except InvalidInputError as err:
        raise ModelFileError(f"{folder / CONFIG_NAME}: {err}") from err
    return config, sampler


def weights_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of every tensor in a safetensors file, read from its header only."""
    if not path.is_file():
        raise ModelNotFoundError(f"{path.parent} has no {WEIGHTS_NAME}")
    try:
        with safe_open(str(path), "pt") as f:
            slices = {k: f.get_slice(k) for k in f.keys()}
            return {k: (tuple(s.get_shape()), s.get_dtype()) for k, s in slices.items()}
    except (SafetensorError, OSError) as err:
        raise ModelFileError(f"{path}: not a readable safetensors file ({err})") from err


def _check_weights(path: Path, skeleton: nn.Module) -> None:
    """Compare the file's header with the state of ``skeleton`` (a meta-device model)."""
    header = weights_header(path)
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    missing = sorted(set(expected) - set(header))
    extra = sorted(set(header) - set(expected))
    shapes = sorted(k for k in set(expected) & set(header) if header[k][0] != expected[k])
    dtypes = sorted(k for k, (_, dtype) in header.items() if k in expected and dtype not in _FLOAT_DTYPES)
    problems = []
    for what, names in (("missing", missing), ("unexpected", extra), ("mis-shaped", shapes),
                        ("not floating-point", dtypes)):
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            problems.append(f"{what}: {shown}")
    if problems:
        raise ModelFileError(f"{path}: weights do not match {CONFIG_NAME} ({'; '.join(problems)})")


def load_model(source: str | Path, device: torch.device | str = "cpu", revision: str | None = None,
               refresh: bool = False) -> nn.Module:
    """Load a saved model from a folder, a bundled short name, or the Hugging Face Hub as ``"org/name"``.

    Everything is checked before the network is built (see the module docstring); weights are
    matched strictly. Errors are :class:`~composable_ebm.errors.CebmError` with one line that
    names the file. ``refresh=True`` asks the Hub for a newer revision even when one is cached.
    """
    folder = resolve_source(source, revision, refresh)
    payload = read_config(folder)
    _, model_cls = MODEL_TYPES[payload["model_type"]]
    config, sampler = typed_configs(folder, payload)
    try:
        with torch.device("meta"):
            skeleton = model_cls(config)
    except ValueError as err:  # a config that cannot describe a network (e.g. too few down-samplings)
        raise ModelFileError(f"{folder / CONFIG_NAME}: {err}") from err
    count = sum(t.numel() for t in skeleton.state_dict().values())
    if count > MAX_PARAMETERS:
        raise ModelFileError(f"{folder / CONFIG_NAME}: describes {count:,} weights; at most {MAX_PARAMETERS:,} are loaded")
    weights = folder / WEIGHTS_NAME
    _check_weights(weights, skeleton)
    try:
        state = load_file(weights)
    except (SafetensorError, OSError) as err:
        raise ModelFileError(f"{weights}: not a readable safetensors file ({err})") from err
    bad = sorted(k for k, v in state.items() if not torch.isfinite(v).all())
    if bad:
        raise NonFiniteError(f"{weights}: non-finite weights in {', '.join(bad[:3])}" + (" ..." if len(bad) > 3 else ""))
    model = model_cls(config)
    model.load_state_dict(state, strict=True)
    model = model.to(device).eval()
    if isinstance(model, Energy):
        if sampler is not None:
            model.sampler_config = sampler
        _probe(model, weights)
    return model


def _probe(model: Energy, weights: Path) -> None:
    """Evaluate the energy on two noise inputs: finite weights can still overflow (e.g. 1e38)."""
    lo, hi = model.value_range if model.value_range is not None else (-1.0, 1.0)
    x = lo + (hi - lo) * torch.rand(2, *model.input_shape, generator=torch.Generator().manual_seed(0))
    labels = {a: torch.zeros(2, dtype=torch.long) for a in model.attributes}
    with torch.no_grad():
        energies = model(x.to(model.device), labels or None)
    if not bool(torch.isfinite(energies).all()):
        raise NonFiniteError(f"{weights}: the weights are finite but give non-finite energies on noise inputs")


BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"


def bundled_models() -> list[str]:
    """Short names of the models shipped inside the package (``load("shapes-color")``)."""
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / CONFIG_NAME).is_file())


def hub_timeout() -> float:
    """Seconds to wait for each answer of the Hub: ``CEBM_HUB_TIMEOUT``, default 5.

    huggingface_hub retries a timed-out request once, so a Hub that never answers fails a load of
    an uncached model after about twice this plus a second (5.0 s measured at 2 s)."""
    text = os.environ.get("CEBM_HUB_TIMEOUT", "5")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"CEBM_HUB_TIMEOUT must be a positive number of seconds, got {text!r}")
    return value


def looks_local(text: str) -> bool:
    """Whether a model name is a path: it starts with ``.``, ``/`` or ``~``, or names an existing folder."""
    return text.startswith((".", "/", "~")) or Path(text).expanduser().is_dir()


_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def resolve_source(source: str | Path, revision: str | None = None, refresh: bool = False) -> Path:
    """The folder of a model: a local folder as is; a bundled model's short name; ``"org/name"`` from
    the local Hub cache, or downloaded when not cached (or when ``refresh``)."""
    text = str(source)
    if not isinstance(source, Path):
        text, revision = split_revision(text, revision)
    if isinstance(source, Path) or looks_local(text):
        path = Path(text).expanduser()
        recover_folder(path)  # a save that died between its renames leaves the old folder beside
        if not path.is_dir():
            raise ModelNotFoundError(f"no model folder at {path}")
        return path
    if text in bundled_models():
        return BUNDLED_DIR / text
    if _REPO_ID.match(text):
        return _from_hub(text, revision, refresh)
    raise ModelNotFoundError(
        f"'{text}' is neither a model folder, a bundled model ({', '.join(bundled_models()) or 'none installed'})"
        " nor a Hub repository id ('org/name')"
    )


def _from_hub(repo: str, revision: str | None, refresh: bool) -> Path:
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub import errors as hub_errors

    patterns = [CONFIG_NAME, WEIGHTS_NAME, CARD_NAME]
    at = f"{repo}@{revision}" if revision else repo
    if not refresh:
        try:
            return Path(snapshot_download(repo_id=repo, revision=revision, allow_patterns=patterns, local_files_only=True))
        except hub_errors.LocalEntryNotFoundError:
            pass  # not cached: download below
    if constants.HF_HUB_OFFLINE:
        raise ModelNotFoundError(f"{at} is not in the local Hub cache and HF_HUB_OFFLINE is set; "
                                 "unset it to download the model, or pass a model folder")
    timeout = hub_timeout()
    try:
        HfApi().repo_info(repo, revision=revision, timeout=timeout)  # bounded: fails fast if the Hub hangs
        local = snapshot_download(repo_id=repo, revision=revision, allow_patterns=patterns, etag_timeout=timeout)
    except (hub_errors.RepositoryNotFoundError, hub_errors.RevisionNotFoundError) as err:
        raise ModelNotFoundError(f"{at}: no such repository or revision on the Hub ({constants.ENDPOINT})") from err
    except hub_errors.HTTPError as err:
        kind = "did not answer within" if "Timeout" in type(err).__name__ else "failed within"
        raise HubUnavailableError(
            f"{at} is not in the local cache and the Hub ({constants.ENDPOINT}) {kind} {timeout:g} s"
            f" ({type(err).__name__}); CEBM_HUB_TIMEOUT sets the wait"
        ) from err
    return Path(local)


def split_revision(name: str, revision: str | None = None) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ``("org/name", "rev")``; an explicit ``revision`` must agree with the suffix."""
    if "@" in name and not looks_local(name):
        name, _, suffix = name.partition("@")
        if not suffix:
            raise InvalidInputError(f"'{name}@' names no revision; write org/name@branch, tag or commit")
        if revision is not None and revision != suffix:
            raise InvalidInputError(f"two revisions for {name}: @{suffix} and revision={revision!r}")
        revision = suffix
    return name, revision


def push_to_hub(model: nn.Module, repo_id: str, revision: str | None = None, private: bool = False,
                token: str | None = None, commit_message: str | None = None, card: str | None = None) -> str:
    """Publish a model to the Hugging Face Hub as ``config.json``, ``model.safetensors`` and its card.

    Creates the repository (and the branch ``revision``) if needed; the token comes from the usual
    places (``HF_TOKEN``, ``hf auth login``) unless given. Returns the commit's URL.
    """
    from composable_ebm.model_cards import model_card

    with tempfile.TemporaryDirectory() as tmp:
        at = f"{repo_id}@{revision}" if revision and revision != "main" else repo_id
        card = card if card is not None else model_card(model, repo_id=at)
        folder = save_model(model, Path(tmp) / "model", card=card)
        return push_folder(folder, repo_id, revision, private, token, commit_message)


def push_folder(folder: str | Path, repo_id: str, revision: str | None = None, private: bool = False,
                token: str | None = None, commit_message: str | None = None) -> str:
    """Publish a saved model folder (checked by loading it first); see :func:`push_to_hub`."""
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hub_errors

    folder = Path(folder)
    if not _REPO_ID.match(repo_id):
        raise InvalidInputError(f"'{repo_id}' is not a Hub repository id; write org/name")
    load_model(folder)  # never publish what would not load
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory() as tmp:
        upload = Path(tmp)
        for name in (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME):
            if (folder / name).is_file():
                shutil.copy2(folder / name, upload / name)
        card = upload / CARD_NAME
        if card.is_file():  # a generated card's usage line loads from where the model now lives
            at = f"{repo_id}@{revision}" if revision and revision != "main" else repo_id
            card.write_text(re.sub(r'cebm\.load\("[^"]*"\)  # or the folder / Hub id it lives in',
                                   f'cebm.load("{at}")', card.read_text()))
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            if revision is not None and revision != "main":
                api.create_branch(repo_id, branch=revision, exist_ok=True)
            info = api.upload_folder(folder_path=upload, repo_id=repo_id, revision=revision,
                                     commit_message=commit_message or f"Upload {folder.name} with composable_ebm")
        except hub_errors.HTTPError as err:
            raise HubUnavailableError(f"pushing {folder} to {repo_id} failed: {' '.join(str(err).split())[:300]}") from err
    return str(info)

