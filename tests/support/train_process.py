"""`mgpu train` in a real process, for the tests that train end to end: digits, no GPUs,
an empty Keras cache; each run its own process (the device split is set once per process)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.support.children import child_env
from tests.support.runfolders import completed_epochs


def train_env(output_dir: Path, **settings: str) -> dict[str, str]:
    return child_env(output_dir.parent / "home", **{
        "TF_CPP_MIN_LOG_LEVEL": "2", "GPUS": "none", "DATASET": "digits", "QUIET": "1",
        "OUTPUT_DIR": str(output_dir), **settings,
    })


def start(output_dir: Path, *args: str, **settings: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "train", *args],
        env=train_env(output_dir, **settings),
        cwd=output_dir.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(output_dir: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    process = start(output_dir, *args, **settings)
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def metrics(output_dir: Path) -> dict:
    return json.loads((output_dir / "metrics.json").read_text())


def wait_for_epochs(output_dir: Path, process: subprocess.Popen[str], epochs: int) -> None:
    """Wait until the checkpoint of epoch `epochs` is the one referenced (history.json is
    written just before the save, so waiting on it would race the save on a busy machine).
    The bound is a run's own (300 s): on a loaded machine running the suite in parallel,
    TensorFlow's start alone took over 120 s."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        if completed_epochs(output_dir) >= epochs:
            return
        time.sleep(0.01)
    raise AssertionError(f"{epochs} epochs did not complete in time")
