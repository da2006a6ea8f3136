"""Atomic file writes: write beside the target, flush to disk, then rename over it.

A crash or an exception mid-write leaves the previous file untouched; the temporary file
(``.NAME.*.tmp``) is removed on an exception, and `remove_stale_temporaries` removes those
a killed process left. Files come out with the user's umask, like any other file they write.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def shared_mode(directory: bool = False) -> int:
    """The permission bits a new file (or folder) gets under the process's umask."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (someone else's counts). An id no
    process can have (not in 1 .. 2^31 - 1, e.g. from a damaged lock file) is not alive."""
    if not 0 < pid < 2**31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's
        return True
    return True


def fsync_file(path: str | Path) -> None:
    """Flush a written file's contents to disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_atomic(path: str | Path, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)``, fsync the result, then ``os.replace`` it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        fsync_file(tmp)
        os.chmod(tmp, shared_mode())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove the temporary files that interrupted `write_atomic` calls for ``path`` left behind.

    Call it only while no other process writes ``path`` (a run folder holds a lock for this).
    """
    path = Path(path)
    if not path.parent.is_dir():
        return []
    stale = [p for p in path.parent.glob(f".{path.name}.*.tmp") if p.is_file()]
    for p in stale:
        p.unlink()
    return stale
