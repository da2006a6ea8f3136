"""The Hugging Face Hub: find a model's files (the local cache first, then a bounded download) and upload them.

This module moves files only: how a model folder is checked and loaded is `composable_ebm.persistence`, and
`composable_ebm.models`, the layer above both, resolves ``org/name[@revision]`` through `hub_snapshot` and pushes
through `upload_folder`.

Hub names load from the local cache without touching the network; only an uncached model (or
``refresh=True``) is downloaded (`download_snapshot`). Every network wait is bounded: connecting and
each read by `hub_timeout` (``CEBM_HUB_TIMEOUT``, default 5 s), each downloaded file in all by
`hub_file_timeout` (``CEBM_HUB_FILE_TIMEOUT``, default 600 s), each request of a push by `hub_timeout`.
Revisions are checked against git's ref-name rules before any path is built from them (`check_revision`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from composable_ebm.atomic import write_atomic
from composable_ebm.configs import MAX_CONFIG_BYTES, MAX_PARAMETERS, load_json
from composable_ebm.errors import HubUnavailableError, InvalidInputError, ModelNotFoundError, ModelFileError
from composable_ebm.folders import CARD_NAME, CONFIG_NAME, MODEL_FILES, WEIGHTS_NAME

"""The files of a model repository; nothing else is downloaded or uploaded."""
MAX_DOWNLOAD_BYTES = 8 * MAX_PARAMETERS + MAX_CONFIG_BYTES
"""Largest file downloaded from the Hub (the largest weights file a model may have, in float64)."""


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


def is_repo_id(text: str) -> bool:
    """Whether ``text`` has the form of a Hub repository id, ``org/name``."""
    return bool(_REPO_ID.match(text))


def check_target(repo_id: str, revision: str | None = None) -> None:
    """One line if ``repo_id`` is not ``org/name`` or ``revision`` breaks git's ref-name rules (`check_revision`)."""
    if not is_repo_id(repo_id):
        raise InvalidInputError(f"'{repo_id}' is not a Hub repository id; write org/name")
    if revision is not None:
        check_revision(revision)


def cached_models(cache_dir: str | Path | None = None) -> Iterator[tuple[str, Path]]:
    """``(name, snapshot folder)`` of every model in the local Hub cache that has a ``config.json``:
    ``org/name``, or ``org/name@rev`` for a revision other than main."""
    from huggingface_hub import constants

    cache = Path(cache_dir or constants.HF_HUB_CACHE).expanduser()
    for repo_dir in sorted(cache.glob("models--*--*")) if cache.is_dir() else []:
        repo = repo_dir.name.removeprefix("models--").replace("--", "/", 1)
        refs = repo_dir / "refs"
        for ref in sorted(p for p in refs.rglob("*") if p.is_file()) if refs.is_dir() else []:
            revision = ref.relative_to(refs).as_posix()
            commit = ref.read_text().strip()
            snapshot = repo_dir / "snapshots" / commit
            if not _COMMIT.fullmatch(commit) or not (snapshot / CONFIG_NAME).is_file():
                continue  # not a composable_ebm model (or not one we can place)
            yield (repo if revision == "main" else f"{repo}@{revision}"), snapshot


def hub_snapshot(repo: str, revision: str | None = None, refresh: bool = False, local_files_only: bool = False,
                 token: str | bool | None = None, cache_dir: str | Path | None = None) -> Path:
    """The local snapshot folder of ``repo`` at ``revision``: from the cache without touching the network,
    else (or when ``refresh``) downloaded by `download_snapshot`; ``local_files_only`` (or
    ``HF_HUB_OFFLINE``) never downloads."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub import errors as hub_errors

    revision = check_revision(revision) if revision is not None else None
    at = f"{repo}@{revision}" if revision else repo
    cache = Path(cache_dir) if cache_dir is not None else Path(constants.HF_HUB_CACHE)
    if cache.exists() and not cache.is_dir():
        where = "cache_dir" if cache_dir is not None else "HF_HUB_CACHE (or HF_HOME)"
        raise InvalidInputError(f"the Hub cache {cache} is a file, not a folder; set {where} to a folder")
    if not refresh:
        try:  # the cache only: refs/<revision> -> snapshots/<commit>, no network
            return Path(snapshot_download(repo_id=repo, revision=revision, allow_patterns=list(MODEL_FILES),
                                          local_files_only=True, cache_dir=cache_dir))
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
    check_target(repo)
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
        return load_json(response.content, f"the Hub's answer for {at}", HubUnavailableError)
    except (json.JSONDecodeError, UnicodeDecodeError):
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        raise HubUnavailableError(f"the Hub answered {at} with {kind}, not JSON ({_snippet(response.text)});"
                                  " is HF_ENDPOINT a Hugging Face Hub?") from None


def _http_library():
    """The HTTP library under huggingface_hub's session: httpx2 (huggingface_hub 2.x) or httpx (1.x)."""
    import importlib

    from huggingface_hub.utils import get_session

    return importlib.import_module(type(get_session()).__module__.split(".")[0])


def _hub_request(method: str, url: str, headers: dict, timeout: float, at: str, stream: bool):
    """One bounded request; an answer other than 2xx becomes one line saying what the server said."""
    httpx = _http_library()
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    bound = httpx.Timeout(timeout)
    try:
        if stream:
            response = get_session().send(get_session().build_request(method, url, headers=headers, timeout=bound),
                                          stream=True)
        else:
            response = get_session().request(method, url, headers=headers, timeout=bound)
    except httpx.HTTPError as err:
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

    httpx = _http_library()
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
            except httpx.TimeoutException as err:
                raise HubUnavailableError(f"{label}: the Hub stopped sending for {timeout:g} s after {received} bytes;"
                                          " CEBM_HUB_TIMEOUT sets the wait") from err
            except httpx.HTTPError as err:
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


def model_files(folder: Path) -> list[Path]:
    """The files of `MODEL_FILES` that ``folder`` holds, each a regular file in the folder itself: a symbolic link
    (which could point anywhere, a private key say) or anything else that is not a plain file is refused in one
    line naming it, before anything is sent."""
    import stat

    out = []
    for name in MODEL_FILES:
        path = folder / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode):
            raise InvalidInputError(f"{path} is a symbolic link (to {os.readlink(path)}); a push uploads only regular"
                                    " files inside the model folder: put the file itself there")
        if not stat.S_ISREG(mode):
            raise InvalidInputError(f"{path} is not a regular file; a push uploads only regular files inside the model"
                                    " folder")
        out.append(path)
    return out


def upload_folder(folder: str | Path, repo_id: str, revision: str | None = None, private: bool = False,
                token: str | None = None, commit_message: str | None = None) -> str:
    """Upload a model folder's files (`MODEL_FILES`) to ``repo_id`` as one commit; returns the commit's URL.

    Creates the repository (and the branch ``revision``) if needed; the token comes from the usual places
    (``HF_TOKEN``, ``hf auth login``) unless given. A generated card's usage line is rewritten to load from
    the repository. The folder is not checked here: `composable_ebm.models.push_folder` loads it first.
    """
    httpx = _http_library()
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hub_errors

    folder = Path(folder)
    check_target(repo_id, revision)
    files = model_files(folder)
    timeout = bound_hub_requests()
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory() as tmp:
        upload = Path(tmp)
        for path in files:
            shutil.copyfile(path, upload / path.name, follow_symlinks=False)
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
        except httpx.HTTPError as err:
            raise _unreachable(f"pushing {folder} to {repo_id}:", err, timeout) from err
        except ValueError as err:  # an answer that is not the Hub's JSON (an HTML page of a proxy or a wrong host)
            raise HubUnavailableError(f"pushing {folder} to {repo_id}: {_endpoint()} answered something that is not"
                                      " the Hub's JSON (a web page?); check HF_ENDPOINT and any proxy") from err
    return str(info)


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


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
    httpx = _http_library()

    seen = err
    while seen is not None:
        if isinstance(seen, (httpx.TimeoutException, TimeoutError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def bound_hub_requests() -> float:
    """Give huggingface_hub's shared HTTP client a timeout of `hub_timeout` for connecting and for
    each read and write (its default waits for ever); returns the timeout. Used before a push."""
    httpx = _http_library()
    from huggingface_hub.utils import _http, set_client_factory

    timeout = hub_timeout()

    def bounded_client():
        client = _http.default_client_factory()
        client.timeout = httpx.Timeout(timeout)
        return client

    set_client_factory(bounded_client)
    return timeout

