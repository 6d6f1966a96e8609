"""A real stall of a user's script under `mgpu run`, on the CPU split into 2 logical devices
(MirroredStrategy, 2 replicas): a script that blocks in a chosen phase (tests/fixtures/
stall/stallscript.py: its data generator, its validation data, a step of its own loop, its
checkpoint's write). The watch names the phase within STALL_TIMEOUT, shows the blocked line
in the main thread's stack and exits 3; the checkpoint the script wrote before stays the
one its index names, whole. A script that does not block runs to its end, and a bad
STALL_TIMEOUT is exit 2 before the script starts."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from mgpu_env.config.exitcodes import EXIT_BAD_CONFIG, EXIT_STALLED
from mgpu_env.training.multiworker.stallhints import EVALUATING, FIRST_STEP, SAVING, STEPS
from tests.support.children import REPO
from tests.support.run_process import mgpu, write

SCRIPT = REPO / "tests" / "fixtures" / "stall" / "stallscript.py"
TIMEOUT_S = 4.0
# The watch polls every TIMEOUT_S / 10; the rest is the report's writing and the exit.
SLACK_S = 2.0


def stalled(tmp_path: Path, mode: str, at: int, **settings: str
            ) -> tuple[subprocess.CompletedProcess[str], float]:
    """The run, and the seconds from the block's start to the process's end."""
    mark = tmp_path / "blocked-at"
    result = mgpu(tmp_path, [str(SCRIPT)], VIRTUAL_DEVICES="2", STALL_IN=mode,
                  STALL_AT=str(at), STALL_MARK=str(mark), **{"STALL_TIMEOUT": "4", **settings})
    ended = time.time()
    assert mark.is_file(), result.stderr[-3000:]
    return result, ended - float(mark.read_text())


def assert_named(result: subprocess.CompletedProcess[str], waited: float, phase: str,
                 blocked_in: str) -> None:
    assert result.returncode == EXIT_STALLED, result.stderr[-3000:]
    assert waited < TIMEOUT_S + SLACK_S, waited
    stderr = result.stderr
    assert (f"error: the run stalled: no progress for {TIMEOUT_S:g} s (STALL_TIMEOUT=4s) in "
            f"{phase}") in stderr, stderr[-3000:]
    assert "across 2 CPU replicas" in stderr or phase == SAVING
    assert "the script's checkpoints are its own" in stderr
    main = stderr.split("Thread MainThread:", 1)[1]
    assert f"in {blocked_in}" in main and 'stallscript.py", line' in main
    assert "Traceback" not in stderr and "finished" not in result.stdout


def assert_checkpoint_whole(tmp_path: Path) -> None:
    """The loop's checkpoint of step 2, written before the block: its index names it and
    both its files are there (a write cut short leaves the index on the one before)."""
    folder = tmp_path / "ckpt"
    assert (folder / "checkpoint").read_text().startswith('model_checkpoint_path: "ckpt-1"')
    assert (folder / "ckpt-1.index").is_file()
    assert (folder / "ckpt-1.data-00000-of-00001").is_file()


def test_a_scripts_data_that_blocks_between_steps_is_named_within_the_bound(
    tmp_path: Path
) -> None:
    result, waited = stalled(tmp_path, "fit-data", 5)
    # Blocked between steps: at least the bound from the last step that ended.
    assert waited >= TIMEOUT_S - 1, waited
    assert_named(result, waited, STEPS, "block")
    assert "(a call of steps took" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "at", "phase", "blocked_in"), [
    ("loop", 1, FIRST_STEP, "block"),  # a py_function in the loop's first step
    ("loop", 9, STEPS, "block"),  # its 5th step (one call per replica)
    ("fit-eval", 0, EVALUATING, "block"),  # fit's validation data
    ("save", 4, SAVING, "serialize"),  # the checkpoint's write, after step 4
])
def test_a_script_that_blocks_is_named_by_its_phase_and_its_checkpoint_stays_whole(
    tmp_path: Path, mode: str, at: int, phase: str, blocked_in: str
) -> None:
    result, waited = stalled(tmp_path, mode, at)
    assert_named(result, waited, phase, blocked_in)
    if phase == FIRST_STEP:  # before the loop's first save
        assert not (tmp_path / "ckpt" / "checkpoint").exists()
    elif mode != "fit-eval":
        assert_checkpoint_whole(tmp_path)


@pytest.mark.slow
def test_a_script_that_does_not_block_runs_to_its_end_under_a_short_bound(
    tmp_path: Path
) -> None:
    # Each phase's progress re-arms the bound: 40 steps, two saves, no stall.
    result = mgpu(tmp_path, [str(SCRIPT)], VIRTUAL_DEVICES="2", STALL_IN="loop",
                  STALL_AT="0", STALL_TIMEOUT="4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("finished")


# A script that waits longer than the bound in its own code, in each place it can: before
# its strategy, between it and its model, after fit, after predict.
OWN_CODE = """\
import time
import numpy as np
import tensorflow as tf
time.sleep(6)
strategy = tf.distribute.MirroredStrategy()
time.sleep(6)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", "mse")
x = np.ones((64, 8), "float32")
model.fit(x, np.ones((64, 2), "float32"), epochs=2, verbose=0)
time.sleep(6)
model.predict(x, verbose=0)
time.sleep(6)
print("finished", flush=True)
"""


@pytest.mark.slow
def test_the_scripts_own_code_is_never_a_stall(tmp_path: Path) -> None:
    write(tmp_path, "own.py", OWN_CODE)
    result = mgpu(tmp_path, ["own.py"], VIRTUAL_DEVICES="2", STALL_TIMEOUT="4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "finished"


@pytest.mark.parametrize("value", ["never", "0.5s"])
def test_a_bad_stall_timeout_is_exit_2_before_the_script(tmp_path: Path, value: str) -> None:
    result = mgpu(tmp_path, [str(SCRIPT)], STALL_TIMEOUT=value, STALL_IN="loop")
    assert result.returncode == EXIT_BAD_CONFIG
    assert f"STALL_TIMEOUT='{value}'" in result.stderr and "Valid: auto, 0" in result.stderr
    assert "Traceback" not in result.stderr and "finished" not in result.stdout
