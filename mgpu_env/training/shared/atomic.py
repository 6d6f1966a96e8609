"""Writes that cannot tear.

A temporary file in the same folder, then `os.replace`d over the old one, which is atomic on
POSIX filesystems; a kill -9 at any moment leaves either the old file or the new one, never
half of one. The run folder's files (`run.rundir`), a folder's count cache (`input.data.files`)
and mgpu bench's results (bench.json) use them."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def temp_beside(path: Path, suffix: str) -> tuple[int, str]:
    """A temporary file in `path`'s folder (so os.replace stays atomic), mode as open() gives."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=suffix, dir=path.parent)
    os.chmod(temp, 0o666 & ~_umask())  # mkstemp makes 0600 files; outputs are for sharing
    return handle, temp


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers (and a crash) see the old or the new file."""
    handle, temp = temp_beside(path, ".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Mapping[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def atomic_save(path: Path, save: Callable[[Path], None], suffix: str) -> None:
    """Let `save` write a temporary file next to `path` (ending in `suffix`), then replace."""
    handle, temp = temp_beside(path, suffix)
    os.close(handle)
    try:
        save(Path(temp))
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
