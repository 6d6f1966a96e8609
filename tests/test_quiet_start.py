"""A healthy start says nothing on stderr, and piped output is plain text (real processes).

TensorFlow's import writes C++ log lines to fd 2 that TF_CPP_MIN_LOG_LEVEL does not hide,
and listing devices calls cuInit even with every GPU hidden; both must stay off a healthy
run's stderr. TF_CPP_MIN_LOG_LEVEL is left unset here, as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_env.config.settings import DECLARATIONS

REPO = Path(__file__).resolve().parent.parent


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


def test_dry_run_without_gpus_writes_nothing_to_stderr(tmp_path: Path) -> None:
    done = mgpu(tmp_path, "train", "--dry-run", GPUS="none")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "dry run" in done.stdout


def test_dry_run_json_is_the_plan(tmp_path: Path) -> None:
    done = mgpu(tmp_path, "train", "--dry-run", "--json", GPUS="none", EPOCHS="1")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["replicas"] == 1 and plan["epochs"] == 1
    assert plan["settings"]["EPOCHS"] == {"value": "1", "source": "env"}
    assert plan["settings"]["BATCH_SIZE"] == {"value": "64", "source": "default"}


@pytest.mark.slow
def test_one_epoch_run_writes_nothing_to_stderr_and_plain_lines_to_a_pipe(
    tmp_path: Path,
) -> None:
    output = tmp_path / "run"
    done = mgpu(tmp_path, "train", GPUS="none", DATASET="digits", EPOCHS="1",
                OUTPUT_DIR=str(output))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    # stdout is a pipe: one plain line per epoch, no progress bar redrawn with \r, no colour.
    assert "\r" not in done.stdout and "\x1b" not in done.stdout
    epoch_lines = [line for line in done.stdout.splitlines() if line.startswith("Epoch ")]
    assert len(epoch_lines) == 1 and "loss" in epoch_lines[0], done.stdout
    settings = json.loads((output / "settings.json").read_text())
    assert settings["settings"]["EPOCHS"] == {"value": "1", "source": "env"}
    assert settings["settings"]["SEED"] == {"value": "42", "source": "default"}
