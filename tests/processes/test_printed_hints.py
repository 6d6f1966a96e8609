"""Every command mgpu prints for the user to run works when run exactly as printed.

The hint is taken from the output it appears in and run by a shell, in the same folder,
with none of the first run's settings in the environment: what a user does next.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.children import REPO
from tests.support.runfolders import completed_epochs
from tests.support.train_process import wait_for_epochs

MGPU_BIN = Path(sys.executable).parent  # where `mgpu` is installed, as a user's PATH has it
SETTING_NAMES = re.compile(r"^(GPUS|DATASET|EPOCHS|RUN_NAME|OUTPUT_DIR|QUIET|ENV_FILE)$")


def user_env(home: Path, **settings: str) -> dict[str, str]:
    """A shell's environment: mgpu on PATH, no mgpu setting unless given."""
    env = {k: v for k, v in os.environ.items()
           if not SETTING_NAMES.match(k) and k not in ("TF_CONFIG", "MGPU_DEBUG")}
    env.update(PATH=f"{MGPU_BIN}{os.pathsep}{env.get('PATH', '')}", HOME=str(home),
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
    env.update(settings)
    return env


@pytest.mark.slow
def test_the_resume_hint_after_sigterm_resumes_the_run_as_printed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = subprocess.Popen(
        ["mgpu", "train"], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=user_env(home, RUN_NAME="sig", DATASET="digits", EPOCHS="30", GPUS="none",
                     QUIET="1"),
    )
    wait_for_epochs(tmp_path / "runs" / "sig", first, 2)
    first.send_signal(signal.SIGTERM)
    _out, err = first.communicate(timeout=60)
    assert first.returncode == 143, err
    hint = re.search(r"Resume with: (.+)", err)
    assert hint, err
    assert hint.group(1) == "OUTPUT_DIR=runs/sig mgpu train"
    done_before = completed_epochs(tmp_path / "runs" / "sig")

    resumed = subprocess.run(
        ["bash", "-c", hint.group(1)], cwd=tmp_path, text=True, capture_output=True,
        env=user_env(home, QUIET="1"), timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "recorded settings: GPUS=none, EPOCHS=30, DATASET=digits" in resumed.stdout
    metrics = json.loads((tmp_path / "runs" / "sig" / "metrics.json").read_text())
    assert metrics["epochs_completed"] == 30 and metrics["dataset"] == "digits"
    assert metrics["resumed_from_epoch"] == done_before >= 2

    # What the user sets still wins over the folder's record: more epochs, same run.
    longer = subprocess.run(
        ["bash", "-c", f"EPOCHS=31 {hint.group(1)}"], cwd=tmp_path, text=True,
        capture_output=True, env=user_env(home, QUIET="1"), timeout=300,
    )
    assert longer.returncode == 0, longer.stderr
    assert "EPOCHS=31 (env)" in longer.stdout
    metrics = json.loads((tmp_path / "runs" / "sig" / "metrics.json").read_text())
    assert metrics["epochs_completed"] == 31 and metrics["resumed_from_epoch"] == 30
