"""Temporary folders a process owns while it lives, removed by whoever outlives it.

A multi-worker run makes two kinds: each non-chief worker's scratch folder for its share of
the (collective) checkpoint saves, and the `--workers` launcher's folder, which is every
worker's TMPDIR. A process that ends normally removes its own; one killed (kill -9, the
kernel's OOM killer, a lost node) cannot, so its folder is removed by the next process that
looks: the launcher between restarts and at its end, a worker or launcher as it starts.

Who owns a folder is a lock, not a process id: each folder holds OWNER_FILE, locked
(flock(2)) by its owner for as long as it lives; the kernel releases the lock when the owner
dies, however it dies, so a folder whose lock can be taken is abandoned, and a live owner's
never is, whichever PID namespace or host (on a shared /tmp) it runs in. The owner's lock
file is locked before it takes its name, so no sweep ever sees an owned folder unlocked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "mgpu-"
OWNER_FILE = ".mgpu-owner"


@dataclass
class OwnedFolder:
    """A folder this process owns (its OWNER_FILE locked) until `remove`."""

    path: Path
    _lock: int | None

    def clear(self) -> None:
        """Remove what the folder holds, its owner's lock kept: between a launcher's
        attempts, when every worker that wrote there has ended."""
        for entry in self.path.iterdir():
            if entry.name != OWNER_FILE:
                _remove(entry)

    def remove(self) -> None:
        """Remove the folder and release it (again: nothing)."""
        if self._lock is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)
        self._lock = None


def owned_folder(name: str, parent: Path | None = None) -> OwnedFolder:
    """A new folder `mgpu-<name>...` in `parent` (default: the temporary folder, TMPDIR),
    owned by this process: its lock file says who (host, process, since when)."""
    path = Path(tempfile.mkdtemp(prefix=PREFIX + name, dir=parent))
    temp = path / f"{OWNER_FILE}.{os.getpid()}"
    lock = os.open(temp, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    os.write(lock, f"{socket.gethostname()} pid {os.getpid()} since {started}\n".encode())
    os.replace(temp, path / OWNER_FILE)
    return OwnedFolder(path, lock)


def sweep_abandoned(parent: Path | None = None) -> list[Path]:
    """Remove the folders `owned_folder` made in `parent` (default: the temporary folder)
    whose owner is gone (their lock can be taken); return them. Folders of live owners,
    of other users, and anything not made by `owned_folder` are left alone."""
    root = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    removed: list[Path] = []
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(PREFIX)]
    except OSError:
        return removed
    for path in candidates:
        try:
            lock = os.open(path / OWNER_FILE, os.O_RDWR | os.O_CLOEXEC)
        except OSError:  # not one of ours, another user's, or being removed
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its owner lives
            os.close(lock)
            continue
        shutil.rmtree(path, ignore_errors=True)
        os.close(lock)
        removed.append(path)
    return removed


def _remove(entry: Path) -> None:
    with contextlib.suppress(OSError):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink()
