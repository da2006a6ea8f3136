"""Save and load models as ``config.json`` + ``model.safetensors`` (strict, nothing pickled).

``config.json`` holds the model type, its typed config and, for energies, the default
sampler settings, so ``load(...).sample(n)`` uses the settings the model was trained for.

Saving replaces a model folder whole or not at all: the new folder is written beside the old
one (``.NAME.new-PID-*``) and swapped in by two renames; if a process dies between them, the next
save or load puts the old folder back. Loading checks everything it can before allocating: the
config's types and sizes (no layer wider than `MAX_WIDTH`), then the
weights file's header against the network the config describes (built on the ``meta`` device,
at most `MAX_PARAMETERS` elements), then that every weight is finite.

Hub names (``org/name``, ``org/name@revision``) load from the local cache without touching the
network; only an uncached model (or ``refresh=True``) is downloaded (`download_snapshot`).
Every network wait is bounded: connecting and each read by `hub_timeout` (``CEBM_HUB_TIMEOUT``,
default 5 s), each downloaded file in all by `hub_file_timeout` (``CEBM_HUB_FILE_TIMEOUT``,
default 600 s), each request of a push by `hub_timeout`. Revisions are checked against git's
ref-name rules before any path is built from them (`check_revision`).
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
from composable_ebm.atomic import fsync_file, pid_alive, shared_mode, write_atomic
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
MAX_DOWNLOAD_BYTES = 8 * MAX_PARAMETERS + MAX_CONFIG_BYTES
"""Largest file downloaded from the Hub (the largest weights file a model may have, in float64)."""

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
    point leaves the previous folder as it was. A symbolic link is followed: the folder it points
    to is replaced and the link keeps pointing to it.
    """
    folder = Path(folder)
    if folder.is_symlink():
        folder = folder.resolve()
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
    """The checked contents of ``folder/config.json``: a JSON object with only `CONFIG_KEYS`."""
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


def list_models() -> list[dict[str, Any]]:
    """The models `load_model` finds without a download: the bundled short names, then the
    composable_ebm models in the local Hub cache (``org/name``, or ``org/name@rev`` for a revision other
    than main), each ``{"name", "source", "type", "attributes"}``. A cached model whose ``config.json``
    cannot be read is listed with an ``"error"`` instead of being left out."""
    from huggingface_hub import constants

    rows = []
    for name in bundled_models():
        rows.append({"name": name, "source": "bundled", **_summary(BUNDLED_DIR / name)})
    cache = Path(constants.HF_HUB_CACHE).expanduser()
    for repo_dir in sorted(cache.glob("models--*--*")) if cache.is_dir() else []:
        repo = repo_dir.name.removeprefix("models--").replace("--", "/", 1)
        refs = repo_dir / "refs"
        for ref in sorted(p for p in refs.rglob("*") if p.is_file()) if refs.is_dir() else []:
            revision = ref.relative_to(refs).as_posix()
            commit = ref.read_text().strip()
            snapshot = repo_dir / "snapshots" / commit
            if not _COMMIT.fullmatch(commit) or not (snapshot / CONFIG_NAME).is_file():
                continue  # not a composable_ebm model (or not one we can place)
            name = repo if revision == "main" else f"{repo}@{revision}"
            rows.append({"name": name, "source": f"hub cache ({snapshot})", **_summary(snapshot)})
    return rows


def _summary(folder: Path) -> dict[str, Any]:
    try:
        payload = read_config(folder)
    except (ModelFileError, ModelNotFoundError) as err:
        return {"type": None, "attributes": {}, "error": str(err)}
    attributes = payload["config"].get("attributes", {}) if isinstance(payload.get("config"), dict) else {}
    return {"type": payload["model_type"], "attributes": {a: list(v) for a, v in attributes.items()}}


def hub_timeout() -> float:
    """Seconds to wait for the Hub to connect and for each of its answers and reads: ``CEBM_HUB_TIMEOUT``,
    default 5. A download also has a total bound per file, `hub_file_timeout`."""
    return _positive_seconds("CEBM_HUB_TIMEOUT", "5")


def _positive_seconds(name: str, default: str) -> float:
    text = os.environ.get(name, default)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"{name} must be a positive number of seconds, got {text!r}")
    return value


def looks_local(text: str) -> bool:
    """Whether a model name is a path: it starts with ``.``, ``/`` or ``~``, names an existing folder, or its
    first part is a folder here (``runs/classifier`` with ``runs/`` present: a missing folder, not a Hub id)."""
    if text.startswith((".", "/", "~")) or Path(text).expanduser().is_dir():
        return True
    first = text.split("@")[0].split("/")[0]
    return "/" in text and bool(first) and Path(first).is_dir()


_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def resolve_source(source: str | Path, revision: str | None = None, refresh: bool = False, *,
                   local_files_only: bool = False, token: str | bool | None = None,
                   cache_dir: str | Path | None = None) -> Path:
    """The folder of a model: a local folder as is; a bundled model's short name; ``"org/name"`` from
    the local Hub cache, or downloaded when not cached (or when ``refresh``; see `load_model`)."""
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
        return _from_hub(text, revision, refresh, local_files_only, token, cache_dir)
    raise ModelNotFoundError(
        f"'{text}' is neither a model folder, a bundled model ({', '.join(bundled_models()) or 'none installed'})"
        " nor a Hub repository id ('org/name')"
    )


def _from_hub(repo: str, revision: str | None, refresh: bool, local_files_only: bool = False,
              token: str | bool | None = None, cache_dir: str | Path | None = None) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub import errors as hub_errors

    revision = check_revision(revision) if revision is not None else None
    at = f"{repo}@{revision}" if revision else repo
    if not refresh:
        try:  # the cache only: refs/<revision> -> snapshots/<commit>, no network
            patterns = [CONFIG_NAME, WEIGHTS_NAME, CARD_NAME]
            return Path(snapshot_download(repo_id=repo, revision=revision, allow_patterns=patterns, local_files_only=True,
                                          cache_dir=cache_dir))
        except hub_errors.LocalEntryNotFoundError:
            pass  # not cached: download below
    if local_files_only or constants.HF_HUB_OFFLINE:
        why = "local_files_only is set" if local_files_only else "HF_HUB_OFFLINE is set"
        raise ModelNotFoundError(f"{at} is not in the local Hub cache and {why}; "
                                 "allow the download, or pass a model folder")
    return download_snapshot(repo, revision, token=token, force=refresh, cache_dir=cache_dir)


_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def check_revision(revision: str) -> str:
    """``revision`` if it is a valid branch, tag or commit name, else one line saying why not.

    The rules are git's (``git check-ref-format``), which the Hub's branch and tag names follow:
    no ``..``, no component starting with ``.`` or ending in ``.lock``, no leading, trailing or
    doubled ``/``, no control characters, spaces or any of ``~^:?*[\\``, no ``@{``. A revision
    names a file in the Hub cache (``refs/<revision>``), so one that broke these rules could
    write outside it (``org/name@../../victim``).
    """
    if not isinstance(revision, str):
        raise InvalidInputError(f"a revision must be a string (branch, tag or commit), got {type(revision).__name__}")
    problem = None
    if not revision:
        problem = "is empty"
    elif len(revision) > 255:
        problem = f"is {len(revision)} characters long (at most 255)"
    elif _REF_FORBIDDEN.search(revision):
        problem = "contains a control character, a space or one of ~ ^ : ? * [ \\"
    elif ".." in revision or "@{" in revision or revision == "@":
        problem = "contains '..' or '@{'"
    elif revision.startswith("/") or revision.endswith(("/", ".")) or "//" in revision:
        problem = "starts or ends with '/', ends with '.' or has an empty component"
    elif any(part.startswith(".") or part.endswith(".lock") for part in revision.split("/")):
        problem = "has a component that starts with '.' or ends with '.lock'"
    if problem:
        raise InvalidInputError(f"revision {revision!r} {problem}; a revision is a branch, tag or commit id"
                                " (git's ref-name rules: no '..', no leading '/', no control characters)")
    return revision


def hub_file_timeout() -> float:
    """Seconds one downloaded file may take in all: ``CEBM_HUB_FILE_TIMEOUT``, default 600.

    Each wait (connect, every read) is bounded by `hub_timeout`; this bounds a download that
    keeps trickling a few bytes at a time."""
    return _positive_seconds("CEBM_HUB_FILE_TIMEOUT", "600")


def download_snapshot(repo: str, revision: str | None = None, token: str | bool | None = None, force: bool = False,
                      cache_dir: str | Path | None = None) -> Path:
    """Download a model's files into the Hugging Face cache; return the snapshot folder.

    The cache layout is huggingface_hub's (``models--org--name/{blobs,snapshots/<commit>,refs/<revision>}``),
    so its tools and offline loads find the model; the download is ours, so that every path comes
    from checked strings (the commit id must be 40 hex digits, the revision a git ref name, the files
    our three names) and every wait is bounded: `hub_timeout` for connecting and for each
    read, `hub_file_timeout` for each file in all. A file is written to a temporary name and
    moved into place only when complete (and matching its SHA-256, where the Hub gives one), so a
    failed download leaves nothing in the cache. Files already in the snapshot are kept unless ``force``.
    """
    from urllib.parse import quote

    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers

    revision = check_revision(revision) if revision is not None else None
    if not _REPO_ID.match(repo):
        raise InvalidInputError(f"'{repo}' is not a Hub repository id; write org/name")
    at = f"{repo}@{revision}" if revision else repo
    endpoint = constants.ENDPOINT.rstrip("/")
    headers = build_hf_headers(token=token)
    timeout, file_timeout = hub_timeout(), hub_file_timeout()
    url = f"{endpoint}/api/models/{repo}/revision/{quote(revision or 'main', safe='')}"
    info = _hub_json(url, headers, timeout, at)
    sha = info.get("sha") if isinstance(info, dict) else None
    if not isinstance(sha, str) or not _COMMIT.fullmatch(sha):
        raise HubUnavailableError(f"the Hub ({endpoint}) answered {at} with commit id {str(sha)[:60]!r}, not 40 hex"
                                  " digits; is HF_ENDPOINT a Hugging Face Hub?")
    siblings = info.get("siblings") if isinstance(info.get("siblings"), list) else []
    names = {s.get("rfilename") for s in siblings if isinstance(s, dict)}
    missing = [n for n in (CONFIG_NAME, WEIGHTS_NAME) if n not in names]
    if missing:
        raise ModelNotFoundError(f"{at} on the Hub has no {' or '.join(missing)}: not a composable_ebm model")
    storage = Path(cache_dir or constants.HF_HUB_CACHE).expanduser() / f"models--{repo.replace('/', '--')}"
    snapshot = storage / "snapshots" / sha
    for name in (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME):
        if name in names and (force or not (snapshot / name).is_file()):
            _download_file(f"{endpoint}/{repo}/resolve/{sha}/{name}", headers, storage, snapshot / name,
                           timeout, file_timeout, f"{at}: {name}")
    if (revision or "main") != sha:  # refs/<revision> holds the commit, as huggingface_hub writes it
        ref = storage / "refs" / (revision or "main")
        if Path(os.path.abspath(storage / "refs")) not in Path(os.path.abspath(ref)).parents:
            raise InvalidInputError(f"revision {revision!r} would write outside the cache")  # unreachable after check
        write_atomic(ref, lambda tmp: Path(tmp).write_text(sha))
    return snapshot


def _hub_json(url: str, headers: dict, timeout: float, at: str) -> Any:
    response = _hub_request("GET", url, headers, timeout, at, stream=False)
    try:
        return response.json()
    except ValueError:
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        raise HubUnavailableError(f"the Hub answered {at} with {kind}, not JSON ({_snippet(response.text)});"
                                  " is HF_ENDPOINT a Hugging Face Hub?") from None


def _hub_request(method: str, url: str, headers: dict, timeout: float, at: str, stream: bool):
    """One bounded request; an answer other than 2xx becomes one line saying what the server said."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    bound = httpx2.Timeout(timeout)
    try:
        if stream:
            response = get_session().send(get_session().build_request(method, url, headers=headers, timeout=bound),
                                          stream=True)
        else:
            response = get_session().request(method, url, headers=headers, timeout=bound)
    except httpx2.HTTPError as err:
        raise _unreachable(f"{at} is not in the local cache and", err, timeout) from err
    if response.status_code < 300:
        return response
    if stream:
        response.read()
    said = response.headers.get("x-error-message") or _snippet(response.text)
    status = f"HTTP {response.status_code} {response.reason_phrase}".strip()
    if response.status_code in (401, 403):
        raise ModelNotFoundError(f"the Hub refused {at}: {status} ({said}); for a private or gated repository"
                                 " log in (hf auth login) or set HF_TOKEN")
    if response.status_code == 404:
        raise ModelNotFoundError(f"{at}: no such repository, revision or file on the Hub ({constants.ENDPOINT}):"
                                 f" {status} ({said})")
    raise HubUnavailableError(f"the Hub ({constants.ENDPOINT}) answered {at} with {status} ({said})")


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return (text[:120] + "...") if len(text) > 120 else (text or "empty body")


def _download_file(url: str, headers: dict, storage: Path, target: Path, timeout: float, file_timeout: float,
                   label: str) -> None:
    import hashlib
    import time

    import httpx2
    from huggingface_hub.utils import are_progress_bars_disabled, tqdm

    blobs = storage / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    partial = blobs / f".download-{os.getpid()}-{os.urandom(4).hex()}.incomplete"
    deadline = time.monotonic() + file_timeout
    digest = hashlib.sha256()
    response = _hub_request("GET", url, headers, timeout, label, stream=True)
    try:
        expected = response.headers.get("content-length")
        expected = int(expected) if expected and expected.isdigit() else None
        if expected is not None and expected > MAX_DOWNLOAD_BYTES:
            raise ModelFileError(f"{label} is {expected} bytes, more than the {MAX_DOWNLOAD_BYTES} a model file may be")
        linked = (response.headers.get("x-linked-etag") or response.headers.get("etag") or "").strip('"').removeprefix("W/").strip('"')
        received = 0
        bar = tqdm(total=expected, unit="B", unit_scale=True, desc=f"{label} (at most {file_timeout:g} s)",
                   disable=are_progress_bars_disabled() or (expected or 0) < 1 << 20)
        with open(partial, "wb") as out, bar:
            try:
                for chunk in response.iter_bytes():  # as it arrives, so the deadline is checked at least every read
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
                    if received > MAX_DOWNLOAD_BYTES:
                        raise ModelFileError(f"{label} is larger than the {MAX_DOWNLOAD_BYTES} bytes a model file may be")
                    if time.monotonic() > deadline:
                        raise HubUnavailableError(f"{label}: the download took more than {file_timeout:g} s"
                                                  f" ({received} bytes received); CEBM_HUB_FILE_TIMEOUT sets the bound")
            except httpx2.TimeoutException as err:
                raise HubUnavailableError(f"{label}: the Hub stopped sending for {timeout:g} s after {received} bytes;"
                                          " CEBM_HUB_TIMEOUT sets the wait") from err
            except httpx2.HTTPError as err:
                raise HubUnavailableError(f"{label}: the download broke off after {received} bytes"
                                          f" ({type(err).__name__})") from err
            out.flush()
            os.fsync(out.fileno())
        if expected is not None and received != expected:
            raise HubUnavailableError(f"{label}: received {received} of {expected} bytes")
        if _SHA256.fullmatch(linked) and linked != digest.hexdigest():
            raise HubUnavailableError(f"{label}: the file's SHA-256 does not match the Hub's ({linked[:12]}...)")
        blob = blobs / digest.hexdigest()
        os.replace(partial, blob)
        target.parent.mkdir(parents=True, exist_ok=True)
        link = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            link.symlink_to(os.path.relpath(blob, target.parent))
        except OSError:  # no symlinks (some Windows setups): a copy, as huggingface_hub does
            shutil.copyfile(blob, link)
        os.replace(link, target)
    finally:
        response.close()
        partial.unlink(missing_ok=True)


def split_revision(name: str, revision: str | None = None) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ``("org/name", "rev")``; an explicit ``revision`` must agree with the suffix."""
    if "@" in name and not looks_local(name):
        name, _, suffix = name.partition("@")
        if not suffix:
            raise InvalidInputError(f"'{name}@' names no revision; write org/name@branch, tag or commit")
        if revision is not None and revision != suffix:
            raise InvalidInputError(f"two revisions for {name}: @{suffix} and revision={revision!r}")
        revision = suffix
    return name, check_revision(revision) if revision is not None else None


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
    """Publish a saved model folder (checked by loading it first); see `push_to_hub`."""
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hub_errors

    folder = Path(folder)
    if not _REPO_ID.match(repo_id):
        raise InvalidInputError(f"'{repo_id}' is not a Hub repository id; write org/name")
    if revision is not None:
        check_revision(revision)
    load_model(folder)  # never publish what would not load
    timeout = bound_hub_requests()
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory() as tmp:
        upload = Path(tmp)
        for name in (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME):
            if (folder / name).is_file():
                shutil.copy2(folder / name, upload / name)
        card = upload / CARD_NAME
        if card.is_file():  # a generated card's usage line loads from where the model now lives
            at = f"{repo_id}@{revision}" if revision and revision != "main" else repo_id
            card.write_text(re.sub(r'^((?:model|classifier) = )cebm\.load\("[^"]*"\).*$',
                                   lambda m: f'{m.group(1)}cebm.load("{at}")', card.read_text(), flags=re.M))
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            if revision is not None and revision != "main":
                api.create_branch(repo_id, branch=revision, exist_ok=True)
            info = api.upload_folder(folder_path=upload, repo_id=repo_id, revision=revision,
                                     commit_message=commit_message or f"Upload {folder.name} with composable_ebm")
        except hub_errors.HTTPError as err:  # huggingface_hub's own, wrapping the HTTP client's
            if not _timed_out(err):
                raise HubUnavailableError(f"pushing {folder} to {repo_id} failed: {' '.join(str(err).split())[:300]}") from err
            raise _unreachable(f"pushing {folder} to {repo_id}:", err, timeout) from err
        except httpx2.HTTPError as err:
            raise _unreachable(f"pushing {folder} to {repo_id}:", err, timeout) from err
    return str(info)


def _unreachable(prefix: str, err: BaseException, timeout: float) -> HubUnavailableError:
    """One line for a Hub that did not answer in time (``CEBM_HUB_TIMEOUT``) or could not be reached."""
    from huggingface_hub import constants

    if _timed_out(err):
        return HubUnavailableError(f"{prefix} the Hub ({constants.ENDPOINT}) did not answer within {timeout:g} s"
                                   f" ({type(err).__name__}); CEBM_HUB_TIMEOUT sets the wait")
    return HubUnavailableError(f"{prefix} the Hub ({constants.ENDPOINT}) could not be reached"
                               f" ({' '.join(str(err).split())[:200] or type(err).__name__})")


def _timed_out(err: BaseException) -> bool:
    """Whether an error of huggingface_hub was a timeout of the HTTP client underneath."""
    import httpx2

    seen = err
    while seen is not None:
        if isinstance(seen, (httpx2.TimeoutException, TimeoutError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def bound_hub_requests() -> float:
    """Give huggingface_hub's shared HTTP client a timeout of `hub_timeout` for connecting and for
    each read and write (its default waits for ever); returns the timeout. Used before a push."""
    import httpx2
    from huggingface_hub.utils import _http, set_client_factory

    timeout = hub_timeout()

    def bounded_client():
        client = _http.default_client_factory()
        client.timeout = httpx2.Timeout(timeout)
        return client

    set_client_factory(bounded_client)
    return timeout

