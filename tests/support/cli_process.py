"""The `mgpu` command in a real process with the environment a user's shell would give it:
no setting, no TF_CPP_MIN_LOG_LEVEL, no GPU mask."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.children import child_env


def clean_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    return child_env(tmp_path / "home", **settings)


def mgpu(tmp_path: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", *args], env=clean_env(tmp_path, **settings),
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )
