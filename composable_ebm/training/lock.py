"""One run per folder: ``RUN_FOLDER/.lock`` holds the owner's host and pid.

A second ``cebm train`` on a folder in use is refused with the owner's pid. A lock whose
process is gone (a killed run) is stale and taken over; a lock from another host cannot be
checked and is refused with the path to delete once that run is known to be gone. A lock that names no
process any machine could have (a pid outside 1 .. 2^31 - 1, a host that is not a name) was not written by a run:
it is refused as damaged, with the path to delete, rather than taken over without a word.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
from pathlib import Path

from composable_ebm.atomic import pid_alive
from composable_ebm.configs import load_json
from composable_ebm.errors import FolderLockedError

LOCK_NAME = ".lock"


def _plausible(owner: dict) -> bool:
    """Whether a lock's record is one a run could have written: a host name and a pid a process can have."""
    pid = owner.get("pid")
    return (isinstance(owner.get("host"), str) and bool(owner["host"]) and isinstance(pid, int)
            and not isinstance(pid, bool) and 0 < pid < 2**31)


class RunLock:
    """Hold ``folder/.lock`` while this process trains into ``folder``; `release` lets it go."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self.held = False
        self.took_over: dict | None = None  # the stale owner this lock replaced, if any
        me = {"host": socket.gethostname(), "pid": os.getpid()}
        for _ in range(3):  # create exclusively; on a stale lock, remove it and try again
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            except FileExistsError:
                owner = self._owner()
                if owner == me:
                    self.held = True  # this process already trains here (e.g. a second Trainer object)
                    return
                if owner is not None and not _plausible(owner):
                    raise FolderLockedError(
                        f"{self.path} is damaged: it names host {owner.get('host')!r}, pid {owner.get('pid')!r}, which no"
                        f" run writes; delete it if no run uses {self.path.parent}"
                    ) from None
                if owner is not None and owner.get("host") != me["host"]:
                    raise FolderLockedError(
                        f"{self.path.parent} is in use by a run on host {owner.get('host')!r} (pid {owner.get('pid')});"
                        f" use another --out, or delete {self.path} if that run is gone"
                    ) from None
                if owner is not None and pid_alive(owner["pid"]):
                    raise FolderLockedError(
                        f"{self.path.parent} is in use by process {owner['pid']}; wait for it to finish or use another --out"
                    ) from None
                self.took_over = owner
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            atexit.register(self.release)
            return
        raise FolderLockedError(f"could not take {self.path}: other processes keep creating it")

    def _owner(self) -> dict | None:
        try:
            owner = load_json(self.path.read_text(), str(self.path))
        except (OSError, ValueError):
            return None  # unreadable or torn: treat as stale
        return owner if isinstance(owner, dict) else None

    def release(self) -> None:
        """Remove the lock if this process still owns it."""
        if self.held and self._owner() == {"host": socket.gethostname(), "pid": os.getpid()}:
            self.path.unlink(missing_ok=True)
        self.held = False
