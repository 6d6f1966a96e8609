"""Whether a Docker engine can run the container tests here."""

from __future__ import annotations

import shutil
import subprocess


def docker_engine_missing() -> str | None:
    """Why the container test cannot run here, or None when it can."""
    if shutil.which("docker") is None:
        return "requires a Docker engine: no docker command"
    try:
        info = subprocess.run(
            ["docker", "info"], capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired:
        return "requires a Docker engine: docker info timed out"
    if info.returncode != 0:
        return f"requires a Docker engine: docker info fails ({info.stderr.strip()[:200]})"
    if shutil.which("make") is None:
        return "requires make"
    return None
