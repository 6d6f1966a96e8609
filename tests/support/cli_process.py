"""The `mgpu` command in a real process with the environment a user's shell would give it:
no setting, no TF_CPP_MIN_LOG_LEVEL, no GPU mask."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mgpu_env.config.settings import DECLARATIONS

REPO = Path(__file__).resolve().parents[2]


def clean_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    drop = {d.env for d in DECLARATIONS} | {
        "TF_CPP_MIN_LOG_LEVEL", "MGPU_DEBUG", "CUDA_VISIBLE_DEVICES", "TF_CONFIG",
        "TF_ENABLED_DEVICE_TYPES", "NO_COLOR", "FORCE_COLOR",
    }
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PYTHONPATH=str(REPO), HOME=str(tmp_path / "home"), **settings)
    return env


def mgpu(tmp_path: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", *args], env=clean_env(tmp_path, **settings),
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )
