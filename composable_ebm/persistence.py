"""The model folder's format: ``config.json`` + ``model.safetensors`` (+ ``README.md``), written whole or not at all
and read strictly (nothing pickled).

``config.json`` holds the model type (`composable_ebm.model_types`), its typed config, the version that wrote it
and, opaque here, the model's sampling defaults (``"sampler"``) and ``"extra"``: `composable_ebm.models` (the layer
above: where models come from, their cards and their sampling defaults) fills and reads them. This module knows no
network class, no Hub, no card and no sampler.

A network class becomes savable by registering its type name (`composable_ebm.model_types.register`) and mixing in
`composable_ebm.pretrained.Pretrained` (``save_pretrained`` / ``from_pretrained`` / ``push_to_hub``), whose methods
reach `composable_ebm.models` when called; this module imports neither.

Saving replaces a model folder whole or not at all: the new folder is written beside the old
one (``.NAME.new-PID-*``) and swapped in by two renames; if a process dies between them, the next
save or load puts the old folder back. Loading checks everything it can before allocating: the
config's types and sizes (no layer wider than `composable_ebm.configs.MAX_WIDTH`), then the
weights file's header against the network the config describes (built on the ``meta`` device,
at most `MAX_PARAMETERS` elements), then that every weight is finite, then that the energy of two
noise inputs is finite.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save
from torch import nn

from composable_ebm._version import __version__
from composable_ebm.atomic import fsync_file, pid_alive, shared_mode
from composable_ebm.configs import MAX_CONFIG_BYTES, MAX_PARAMETERS, config_from_dict, config_to_dict, load_json
from composable_ebm.energy import Energy
from composable_ebm.errors import InvalidInputError, ModelFileError, ModelNotFoundError, NonFiniteError
from composable_ebm.folders import CARD_NAME, CONFIG_NAME, WEIGHTS_NAME
from composable_ebm.model_types import MODEL_TYPES, model_class

__all__ = [
    "CARD_NAME", "CONFIG_KEYS", "CONFIG_NAME", "MAX_PARAMETERS", "WEIGHTS_NAME", "check_new_folder",
    "model_payload", "network_config", "read_config", "read_model", "recover_folder", "weights_header",
    "write_model",
]

CONFIG_KEYS = ("model_type", "config", "composable_ebm_version", "sampler", "extra")
"""The keys a ``config.json`` may hold; any other is an error."""
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")

def _model_type(model: nn.Module) -> str:
    name = getattr(type(model), "model_type", None)
    if name is None or name not in MODEL_TYPES or MODEL_TYPES.get(name) is not type(model):
        raise TypeError(f"cannot save a {type(model).__name__}; savable types: {MODEL_TYPES.names()}")
    return name


def model_payload(model: nn.Module) -> dict[str, Any]:
    """What ``config.json`` holds of ``model`` itself: its type, config and the version writing it."""
    return {"model_type": _model_type(model), "config": config_to_dict(model.config),
            "composable_ebm_version": __version__}


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


def write_model(model: nn.Module, folder: str | Path, payload: dict[str, Any], card: str | None = None, *,
                overwrite: bool = True) -> Path:
    """Write ``config.json`` (``payload``: `model_payload` and the keys of the layer above), ``model.safetensors``
    (and ``README.md`` if a card is given).

    The folder is replaced whole by an atomic swap: a failure at any point leaves the previous folder as it was.
    Other files in it stay, linked into the new folder (hard links: nothing is copied, so no second copy's space is
    needed). A symbolic link is followed: the folder it points to is replaced and the link keeps pointing to it.
    ``overwrite=False`` refuses a folder that exists and is not empty (`check_new_folder`): the command line's
    ``--out`` without ``--overwrite``.
    """
    unknown = sorted(set(payload) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"config.json keys {unknown} are not in its format; valid keys: {list(CONFIG_KEYS)}")
    folder = Path(folder)
    if not overwrite:
        check_new_folder(folder)
    if folder.is_symlink():
        folder = folder.resolve()
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


def network_config(payload: dict[str, Any], path: Path) -> Any:
    """The typed network config of a ``config.json`` payload (read from ``path``), type- and range-checked."""
    try:
        return config_from_dict(model_class(payload["model_type"]).config_class, payload["config"])
    except InvalidInputError as err:
        raise ModelFileError(f"{path}: {err}") from err


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


def read_model(folder: Path, device: torch.device | str = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """The model saved in ``folder`` and its ``config.json`` payload (whose ``"sampler"`` and ``"extra"`` the layer
    above reads), everything checked before the network is built."""
    payload = read_config(folder)
    model_cls = model_class(payload["model_type"])
    config = network_config(payload, folder / CONFIG_NAME)
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
    if isinstance(model, Energy):
        _probe(model, weights)
    return model, payload


def _probe(model: Energy, weights: Path) -> None:
    """Evaluate the energy on two noise inputs: finite weights can still overflow (e.g. 1e38)."""
    lo, hi = model.value_range if model.value_range is not None else (-1.0, 1.0)
    x = lo + (hi - lo) * torch.rand(2, *model.input_shape, generator=torch.Generator().manual_seed(0))
    labels = {a: torch.zeros(2, dtype=torch.long) for a in model.attributes}
    with torch.no_grad():
        energies = model(x.to(model.device), labels or None)
    if not bool(torch.isfinite(energies).all()):
        raise NonFiniteError(f"{weights}: the weights are finite but give non-finite energies on noise inputs")
