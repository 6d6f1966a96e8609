"""A healthy start says nothing on stderr, and piped output is plain text (real processes).

TensorFlow's import writes C++ log lines to fd 2 that TF_CPP_MIN_LOG_LEVEL does not hide,
and listing devices calls cuInit even with every GPU hidden; both must stay off a healthy
run's stderr. TF_CPP_MIN_LOG_LEVEL is left unset here, as a user would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli_process import mgpu


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
