"""Save and load models as ``config.json`` + ``model.safetensors`` (strict, nothing pickled).

``config.json`` holds the model type, its typed config and, for energies, the model's sampling defaults
(`composable_ebm.sampling.SamplingDefaults`, key ``"sampler"``), so ``load(...).sample(n)`` uses the settings the
model was trained for.

A network class becomes savable by registering its type name (`register`) and mixing in
`Pretrained` (``save_pretrained`` / ``from_pretrained`` / ``push_to_hub``, the names of
huggingface_hub's ``ModelHubMixin``). This module sits below the networks and names none of them:
the package's own types are found through the ``composable_ebm.model_types`` entry points
(pyproject.toml), so a model loads whichever modules were imported before, and another package can
add types the same way.

Saving replaces a model folder whole or not at all: the new folder is written beside the old
one (``.NAME.new-PID-*``) and swapped in by two renames; if a process dies between them, the next
save or load puts the old folder back. Loading checks everything it can before allocating: the
config's types and sizes (no layer wider than `composable_ebm.configs.MAX_WIDTH`), then the
weights file's header against the network the config describes (built on the ``meta`` device,
at most `MAX_PARAMETERS` elements), then that every weight is finite, then that the energy of two
noise inputs is finite.

A model is named by a folder, a bundled short name, or ``org/name[@revision]`` on the Hugging Face
Hub, which `composable_ebm.hub` (the layer below) finds in the local cache or downloads.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save
from torch import nn

from composable_ebm._version import __version__
from composable_ebm.atomic import fsync_file, pid_alive, shared_mode
from composable_ebm.configs import MAX_CONFIG_BYTES, MAX_PARAMETERS, config_from_dict, config_to_dict, load_json
from composable_ebm.energy import Energy, NoiseConditioned
from composable_ebm.errors import InvalidInputError, ModelFileError, ModelNotFoundError, NonFiniteError
from composable_ebm.hub import (
    CARD_NAME,
    CONFIG_NAME,
    WEIGHTS_NAME,
    cached_models,
    check_target,
    hub_snapshot,
    is_repo_id,
    looks_local,
    model_files,
    split_revision,
    upload_folder,
)
from composable_ebm.model_cards import model_card
from composable_ebm.sampling import LadderConfig, SamplingDefaults

__all__ = [
    "BUNDLED_DIR", "CARD_NAME", "CONFIG_KEYS", "CONFIG_NAME", "MAX_PARAMETERS", "WEIGHTS_NAME", "Pretrained",
    "bundled_models", "list_models", "load_model", "model_class", "push_folder", "push_to_hub", "read_config",
    "recover_folder", "register", "resolve_source", "save_model", "typed_configs", "weights_header",
]

CONFIG_KEYS = ("model_type", "config", "composable_ebm_version", "sampler", "extra")
"""The keys a ``config.json`` may hold; any other is an error."""
ENTRY_POINT_GROUP = "composable_ebm.model_types"
"""The entry-point group naming the savable classes: ``model_type = "module:Class"``."""
BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")

_REGISTRY: dict[str, type] = {}
M = TypeVar("M", bound=type)


def register(model_type: str) -> Callable[[M], M]:
    """Class decorator: ``@register("resnet_energy")`` saves the class under that ``model_type``.

    The class takes one typed config (its ``config_class``, stored as ``self.config``); one name per class.
    """

    def add(cls: M) -> M:
        if not isinstance(getattr(cls, "config_class", None), type):
            raise TypeError(f"{cls.__name__} needs a config_class (the config dataclass its constructor takes)")
        known = _REGISTRY.get(model_type)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise ValueError(f"model_type {model_type!r} is taken by {known.__name__}")
        _REGISTRY[model_type] = cls
        cls.model_type = model_type
        return cls

    return add


def model_class(model_type: str, where: str = "") -> type:
    """The class registered as ``model_type``, importing the module its entry point names if need be."""
    if model_type not in _REGISTRY:
        points = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
        if model_type in points:
            points[model_type].load()  # the module registers its classes as it is imported
        if model_type not in _REGISTRY:
            known = sorted(set(_REGISTRY) | set(points))
            raise ModelFileError(f"{where}unknown model_type {model_type!r}; known types: {known}")
    return _REGISTRY[model_type]


def _model_type(model: nn.Module) -> str:
    name = getattr(type(model), "model_type", None)
    if name is None or _REGISTRY.get(name) is not type(model):
        raise TypeError(f"cannot save a {type(model).__name__}; savable types: {sorted(c.__name__ for c in _REGISTRY.values())}")
    return name


INPUT_KEY = "composable_ebm.input"
"""The weights file's metadata key recording what the weights were trained to see: the input shape and the input
transforms. A config.json edited to disagree (another image size, a transform removed) is refused on load."""


def _input_record(model: nn.Module) -> dict[str, Any]:
    record: dict[str, Any] = {}
    if isinstance(model, Energy):
        record["input_shape"] = list(model.input_shape)
    transforms = getattr(getattr(model, "config", None), "input_transforms", None)
    if transforms is not None:
        record["input_transforms"] = list(transforms)
    return record


def weights_metadata(model: nn.Module) -> dict[str, str]:
    """The metadata ``model.safetensors`` carries beside the tensors: `INPUT_KEY` alone (``{"format": "pt"}`` for a
    model without an input record). One key, because safetensors writes several in a random order, and the same
    weights should give the same bytes."""
    record = _input_record(model)
    return {INPUT_KEY: json.dumps(record)} if record else {"format": "pt"}


def _check_input_record(path: Path, model: nn.Module, metadata: dict[str, str]) -> None:
    """Refuse a config that describes another input than the weights were saved for (when the weights file's
    ``metadata`` says)."""
    text = metadata.get(INPUT_KEY)
    if text is None:
        return
    try:
        saved = load_json(text, f"{path}: its {INPUT_KEY} metadata", ModelFileError)
    except json.JSONDecodeError as err:
        raise ModelFileError(f"{path}: its {INPUT_KEY} metadata is not JSON") from err
    now = _input_record(model)
    for key in sorted(set(saved) & set(now)):
        if saved[key] != now[key]:
            raise ModelFileError(f"{path.parent / CONFIG_NAME} describes {key} {now[key]}, but {path.name} was saved"
                                 f" for {saved[key]}; the config was edited: restore it")


def write_weights(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """Write a safetensors file from Python (so a folder name that is not UTF-8 works too)."""
    path.write_bytes(save(state, metadata=metadata))


def model_payload(model: nn.Module) -> dict[str, Any]:
    """What ``config.json`` holds for ``model``: its type, config, version and (energies) sampling defaults."""
    payload: dict[str, Any] = {
        "model_type": _model_type(model),
        "config": config_to_dict(model.config),
        "composable_ebm_version": __version__,
    }
    if isinstance(model, Energy):
        defaults = getattr(model, "sampling_defaults", None)
        if defaults is not None and isinstance(defaults.sampler, LadderConfig) != isinstance(model, NoiseConditioned):
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
    """Write ``config.json``, ``model.safetensors`` (and ``README.md`` if a model card is given).

    The folder is replaced whole by an atomic swap: a failure at any point leaves the previous folder as it was.
    Other files in it stay, linked into the new folder (hard links: nothing is copied, so no second copy's space is
    needed). A symbolic link is followed: the folder it points to is replaced and the link keeps pointing to it.
    ``overwrite=False`` refuses a folder that exists and is not empty (`check_new_folder`): the command line's
    ``--out`` without ``--overwrite``.
    """
    folder = Path(folder)
    if not overwrite:
        check_new_folder(folder)
    if folder.is_symlink():
        folder = folder.resolve()
    payload = model_payload(model)
    if extra:
        payload["extra"] = extra
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    folder.parent.mkdir(parents=True, exist_ok=True)
    recover_folder(folder)
    _refuse_a_file(folder)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.new-{os.getpid()}-"))
    try:
        os.chmod(staging, shared_mode(directory=True))
        write_weights(state, staging / WEIGHTS_NAME, weights_metadata(model))
        (staging / CONFIG_NAME).write_text(json.dumps(payload, indent=2) + "\n")
        if card is not None:
            (staging / CARD_NAME).write_text(card)
        ours = {WEIGHTS_NAME, CONFIG_NAME} | ({CARD_NAME} if card is not None else set())
        if folder.is_dir():
            _link_tree(folder, staging, skip=ours)
        for name in ours:  # safetensors writes 0600; a model folder is for sharing
            os.chmod(staging / name, shared_mode())
            fsync_file(staging / name)
        _swap_in(staging, folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return folder


def _refuse_a_file(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise InvalidInputError(f"{folder} exists and is not a folder; a model is saved as a folder: choose a new one")


def check_new_folder(folder: str | Path) -> None:
    """Refuse an output folder that exists and holds anything (or is a file), in one line that names
    ``--overwrite``: a save never replaces what it was not asked to."""
    folder = Path(folder)
    _refuse_a_file(folder)
    if folder.is_dir():
        entries = sorted(p.name for p in itertools.islice(folder.iterdir(), 4))
        if entries:
            shown = ", ".join(entries[:3]) + (" ..." if len(entries) > 3 else "")
            raise InvalidInputError(f"{folder} is not empty ({shown}); choose a new or empty folder, or pass"
                                    " --overwrite to replace the model files in it (other files stay)")


def _link_tree(source: Path, target: Path, skip: set[str] = frozenset()) -> None:
    """Recreate ``source``'s entries (but ``skip``) in ``target`` without copying data: files as hard links, folders
    as new folders of links, symbolic links as links to the same place. A file system without hard links gets
    copies."""
    for item in source.iterdir():
        if item.name in skip:
            continue
        dest = target / item.name
        if item.is_symlink():
            os.symlink(os.readlink(item), dest)
        elif item.is_dir():
            dest.mkdir()
            shutil.copystat(item, dest)
            _link_tree(item, dest)
        else:
            try:
                os.link(item, dest)
            except OSError:
                shutil.copy2(item, dest, follow_symlinks=False)


def _swap_in(staging: Path, folder: Path) -> None:
    if not folder.exists():
        os.rename(staging, folder)
        return
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


def read_config(folder: str | Path, path: str | Path | None = None) -> dict[str, Any]:
    """The checked contents of ``folder/config.json`` (or of ``path``, a file in that format): a JSON object with
    only `CONFIG_KEYS` and a known ``model_type``."""
    path = Path(path) if path is not None else Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise ModelNotFoundError(f"{folder} has no {CONFIG_NAME}; a model folder holds {CONFIG_NAME} and {WEIGHTS_NAME}")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ModelFileError(f"{path}: {path.stat().st_size} bytes; a {CONFIG_NAME} is at most {MAX_CONFIG_BYTES}")
    try:
        payload = load_json(path.read_text(), str(path), ModelFileError)
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
    if not isinstance(payload["model_type"], str):
        raise ModelFileError(f"{path}: model_type must be a string, got {type(payload['model_type']).__name__}")
    model_class(payload["model_type"], where=f"{path}: ")
    return payload


def typed_configs(folder: Path, payload: dict[str, Any],
                  path: Path | None = None) -> tuple[Any, SamplingDefaults | None]:
    """The network config and sampling defaults of a ``config.json`` payload, type- and range-checked."""
    cls = model_class(payload["model_type"])
    try:
        config = config_from_dict(cls.config_class, payload["config"])
        sampler = (SamplingDefaults.from_flat(payload["sampler"], ladder=issubclass(cls, NoiseConditioned), saved=True)
                   if payload.get("sampler") is not None else None)
    except InvalidInputError as err:
        raise ModelFileError(f"{path or folder / CONFIG_NAME}: {err}") from err
    return config, sampler


_ITEM_BYTES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4,
               "I64": 8, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
MAX_HEADER_BYTES = 100_000_000
"""Largest safetensors header read (the format's own bound)."""


def read_safetensors_header(path: Path) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict[str, str]]:
    """The tensors' ``name -> (shape, dtype)`` and the metadata of a safetensors file, from its header alone, checked
    as the format requires (offsets inside the file, sizes matching shapes). Read in Python, so a folder name that
    is not UTF-8 opens too."""
    def bad(why: str) -> ModelFileError:
        return ModelFileError(f"{path}: not a readable safetensors file ({why})")

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(8)
        if len(raw) < 8:
            raise bad("shorter than its header's length")
        n = int.from_bytes(raw, "little")
        if n > min(size - 8, MAX_HEADER_BYTES):
            raise bad(f"a header of {n:,} bytes in a file of {size:,}")
        try:
            header = load_json(f.read(n), f"{path}: not a readable safetensors file (its header)", ModelFileError)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise bad(f"its header is not JSON: {err}") from err
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise bad("its metadata is not a table of strings")
    data, tensors, spans = size - 8 - n, {}, []
    for name, info in header.items():
        ok = isinstance(info, dict) and isinstance(info.get("dtype"), str) and isinstance(info.get("shape"), list)
        shape, offsets = (info.get("shape"), info.get("data_offsets")) if ok else (None, None)
        ok = ok and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape) and \
            isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
        if not ok or info["dtype"] not in _ITEM_BYTES or not 0 <= offsets[0] <= offsets[1] <= data:
            raise bad(f"tensor {name!r} is described wrongly")
        if offsets[1] - offsets[0] != math.prod(shape) * _ITEM_BYTES[info["dtype"]]:
            raise bad(f"tensor {name!r}'s bytes do not match its shape")
        tensors[name] = (tuple(shape), info["dtype"])
        spans.append(tuple(offsets))
    spans.sort()
    if any(a[1] > b[0] for a, b in itertools.pairwise(spans)):
        raise bad("its tensors overlap")
    return tensors, metadata


def weights_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of every tensor in a safetensors file, read from its header only."""
    return _weights_header_and_metadata(path)[0]


def _weights_header_and_metadata(path: Path) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict[str, str]]:
    if not path.is_file():
        raise ModelNotFoundError(f"{path.parent} has no {WEIGHTS_NAME}")
    try:
        return read_safetensors_header(path)
    except OSError as err:
        raise ModelFileError(f"{path}: not a readable safetensors file ({err})") from err


def _check_weights(path: Path, skeleton: nn.Module, header: dict[str, tuple[tuple[int, ...], str]]) -> None:
    """Compare the file's ``header`` with the state of ``skeleton`` (a meta-device model)."""
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
    """Load a resolved model folder, checking everything before the network is built."""
    payload = read_config(folder)
    model_cls = model_class(payload["model_type"])
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
    header, metadata = _weights_header_and_metadata(weights)  # read once, for both checks
    _check_weights(weights, skeleton, header)
    _check_input_record(weights, skeleton, metadata)
    try:
        state = load(weights.read_bytes())  # read in Python: a folder name that is not UTF-8 loads too
    except (SafetensorError, OSError) as err:
        raise ModelFileError(f"{weights}: not a readable safetensors file ({err})") from err
    bad = sorted(k for k, v in state.items() if not torch.isfinite(v).all())
    if bad:
        raise NonFiniteError(f"{weights}: non-finite weights in {', '.join(bad[:3])}" + (" ..." if len(bad) > 3 else ""))
    model = model_cls(config)
    model.load_state_dict(state, strict=True)
    model = model.to(device).eval()
    card = folder / CARD_NAME
    if card.is_file() and not card.is_symlink() and card.stat().st_size <= MAX_CONFIG_BYTES:
        model.card = card.read_text(encoding="utf-8", errors="replace")  # a push keeps it (license, results)
    if isinstance(model, Energy):
        model.sampling_defaults = sampler
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
    load_model(Path(folder))
    return upload_folder(folder, repo_id, revision, private, token, commit_message)


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


P = TypeVar("P", bound="Pretrained")


class Pretrained:
    """``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` for a registered class (`register`).

    An energy among them carries ``sampling_defaults`` (`SamplingDefaults`, ``None`` until set): the settings it
    was trained for, saved in its ``config.json`` and read by the sampling pipeline.
    """

    sampling_defaults: SamplingDefaults | None = None
    card: str | None = None  # the README.md it was loaded with, which a push keeps

    def save_pretrained(self, folder: str | Path, card: str | None = None) -> Path:
        """Save as ``config.json`` + ``model.safetensors`` with a model card (default: the card it was loaded with,
        else a generated one)."""
        if card is None:
            card = self.card or model_card(self, location=str(folder))
        return save_model(self, folder, card=card)

    def push_to_hub(self, repo_id: str, revision: str | None = None, private: bool = False,
                    token: str | None = None, commit_message: str | None = None) -> str:
        """Publish to the Hugging Face Hub (see `push_to_hub`); returns the commit URL."""
        return push_to_hub(self, repo_id, revision=revision, private=private, token=token,
                           commit_message=commit_message)

    @classmethod
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
