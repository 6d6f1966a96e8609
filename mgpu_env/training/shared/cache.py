"""The user's cache folder for what mgpu keeps between starts.

$XDG_CACHE_HOME, else ~/.cache, then mgpu/<what> (a folder's counts: `input.data.files`; a
built-in model's memory estimate: `step.memprobe`). In the image XDG_CACHE_HOME is /cache, the
compose file's volume, so the cache outlives `docker compose run`'s containers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def user_cache_dir(what: str, environ: Mapping[str, str]) -> Path:
    """The cache folder for `what` (not created)."""
    base = Path(environ.get("XDG_CACHE_HOME") or Path(environ.get("HOME", "~")) / ".cache")
    return base.expanduser() / "mgpu" / what
