"""`MODEL=module:function` in a dry run: the model is built on the CPU and checked against
the data's classes, and a hook module that imports Keras at its top brings none of
TensorFlow's C++ start-up lines to stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_env.estimate.memory import size_text
from tests.support.children import REPO
from tests.support.filedata import write_npy

pytestmark = pytest.mark.slow

# What everyone writes: `import keras` at the top, the model built from it.
HOOK = """\
import keras


def build(input_shape, num_classes):
    return keras.Sequential([
        keras.Input(shape=input_shape),
        keras.layers.Flatten(),
        keras.layers.Dense({outputs}, activation="softmax"),
    ])
"""


def _dry_run(folder: Path, outputs: int) -> subprocess.CompletedProcess[str]:
    (folder / "mymodels.py").write_text(HOOK.format(outputs=outputs))
    data = write_npy(folder / "data", train=40, test=10, classes=5)
    # No TF_CPP_MIN_LOG_LEVEL: TensorFlow's start-up lines would show, unless mgpu hides them.
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "MGPU_DEBUG", "TF_CPP_MIN_LOG_LEVEL")}
    env.update(PYTHONPATH=str(REPO), GPUS="none", MODEL="mymodels:build",
               DATASET=f"npy:{data}", OUTPUT_DIR=str(folder / "run"), BATCH_SIZE="8",
               HOME=str(folder / "home"))
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", "train", "--dry-run"], env=env, cwd=folder,
        capture_output=True, text=True, timeout=300,
    )


def test_a_model_that_does_not_fit_the_classes_fails_the_dry_run(tmp_path: Path) -> None:
    result = _dry_run(tmp_path, outputs=3)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == (
        "error: MODEL=mymodels:build: the model outputs shape (1, 3) for one sample; the "
        "data has 5 classes, so expected (1, 5).\n"
        "  Fix: end the model with Dense(num_classes) and a softmax.\n"
    )
    assert not (tmp_path / "run").exists()


def test_a_model_that_fits_passes_with_a_note_and_a_quiet_stderr(tmp_path: Path) -> None:
    result = _dry_run(tmp_path, outputs=5)
    assert result.returncode == 0, result.stderr
    # Flatten(8x8) -> Dense(5): 64 x 5 weights + 5 biases.
    assert ("note: MODEL=mymodels:build was built on the CPU for this check: 325 "
            "parameters, outputs (batch, 5) for the data's 5 classes") in result.stdout
    # Its memory, from the child that built it: 325 float32 weights, their gradients and
    # Adam's two slots; the outputs of Flatten (64) and Dense (5) at BATCH_SIZE=8.
    assert (f"  memory         per replica: about {size_text(4 * 325 * 4 + 69 * 4 * 8)} "
            f"(weights {size_text(325 * 4)}, gradients {size_text(325 * 4)}, optimizer "
            f"slots {size_text(2 * 325 * 4)}, activations {size_text(69 * 4 * 8)} at batch 8)"
            ) in result.stdout
    assert result.stderr == ""
    assert not (tmp_path / "run").exists()
