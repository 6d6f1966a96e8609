"""A supervised `mgpu train --max-restarts` on the CPU, faults made real below the code: a
MODEL whose layer fails once at a chosen step (`tests/fixtures/recover/faultmodel.py`: it
raises, or sleeps until the stall watch ends the run), and a fake NVML, answering as pynvml
does, in the supervisor's process, that reports a GPU lost.

- After a crash and after a stall the run restarts from its last checkpoint and ends with
  the uninterrupted run's bits: every epoch's loss and accuracy, the test metrics, and the
  saved weights' file byte for byte.
- On 4 logical devices standing for 4 GPUs (VIRTUAL_DEVICES=4), a crash with GPU 2 lost
  in NVML resumes on 3 at the same global batch (12 = 4 x 3 = 3 x 4), the same data order
  and learning rate: the losses are within 1e-5 of the run that never lost one, not bitwise,
  since 3 replicas sum the gradients in another order than 4 (float addition is not
  associative). Where, when and why is in the log and metrics.json.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mgpu_env.config.exitcodes import EXIT_STALLED
from mgpu_env.recovery import Recovering, RunDevices, supervise_run
from mgpu_env.training.multiworker.stallhints import STEPS
from tests.support import train_process
from tests.support.children import REPO
from tests.support.fake_nvml import FakeGpu, FakeNvml, fake_gpus

HOOK = {"PYTHONPATH": f"{REPO / 'tests' / 'fixtures' / 'recover'}:{REPO}",
        "MODEL": "faultmodel:build", "EPOCHS": "2", "CHECKPOINT_EVERY": "5", "SEED": "7"}
FAULT_AT = 30  # digits at 64 a batch: 22 steps an epoch, so epoch 2's 8th step


def _history(folder: Path) -> list[dict[str, Any]]:
    return json.loads((folder / "history.json").read_text())["epochs"]


def _weights(folder: Path) -> bytes:
    with zipfile.ZipFile(folder / "model.keras") as saved:
        return saved.read("model.weights.h5")


def _same_bits(run: Path, reference: Path) -> None:
    for ours, theirs in zip(_history(run), _history(reference), strict=True):
        assert (ours["loss"], ours["accuracy"]) == (theirs["loss"], theirs["accuracy"])
    for key in ("test_loss", "test_accuracy"):
        assert train_process.metrics(run)[key] == train_process.metrics(reference)[key]
    assert _weights(run) == _weights(reference)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("uninterrupted") / "run"
    result = train_process.run(folder, **HOOK)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["crash", "stall"])
def test_a_run_restarted_after_a_crash_or_a_stall_ends_bit_for_bit(
    tmp_path: Path, uninterrupted: Path, fault: str
) -> None:
    folder = tmp_path / "run"
    result = train_process.run(
        folder, "--max-restarts", "1", **HOOK, FAULT=fault, FAULT_AT=str(FAULT_AT),
        FAULT_ONCE=str(tmp_path / "fired"), STALL_TIMEOUT="4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "fired").read_text() == fault  # the fault did happen, once
    code = EXIT_STALLED if fault == "stall" else 1
    assert (f"mgpu: restart 1 of 1 (the run exited {code}): starting it again from the last "
            "checkpoint") in result.stderr
    if fault == "stall":
        assert f"the run stalled: no progress for 4 s (STALL_TIMEOUT=4s) in {STEPS}" in \
            result.stderr
    assert "recovered:" not in result.stderr  # one replica, the CPU: nothing to change
    _same_bits(folder, uninterrupted)


@pytest.mark.slow
def test_a_signal_passes_through_and_is_not_restarted(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    process = train_process.start(folder, "--max-restarts", "3", **{**HOOK, "EPOCHS": "200"})
    train_process.wait_for_epochs(folder, process, 1)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    # The run stopped at a step boundary with a checkpoint, as it does unsupervised.
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "restart 1" not in stderr


def _supervised(folder: Path, environ: dict[str, str], said: list[str]) -> int:
    recovering = Recovering(
        folder, RunDevices((0, 1, 2, 3), 1, 12, setting="VIRTUAL_DEVICES"),
        all_reduce="reduction_to_one", requested_all_reduce="auto", min_gpus=2,
        say=said.append, max_restarts=1)
    out, err = io.StringIO(), io.StringIO()
    code = supervise_run([sys.executable, "-m", "entrypoint", "train"], environ, recovering,
                         stdout=out, stderr=err)
    said.append(err.getvalue())
    return code


LOST_GPU = 2
FOUR = {**HOOK, "VIRTUAL_DEVICES": "4", "BATCH_SIZE": "3", "CHECKPOINT_EVERY": "10"}


@pytest.mark.slow
def test_a_run_that_loses_a_gpu_goes_on_with_three_at_the_same_global_batch(
    tmp_path: Path, use_fake_nvml: Callable[[FakeNvml], FakeNvml]
) -> None:
    reference = tmp_path / "reference"
    result = train_process.run(reference, **FOUR)
    assert result.returncode == 0, result.stderr[-3000:]
    # The machine as the supervisor's health check sees it after the crash: GPU 2 has
    # fallen off the bus (nvmlDeviceGetHandleByIndex answers NVML_ERROR_GPU_IS_LOST).
    use_fake_nvml(fake_gpus([FakeGpu() for _ in range(4)], handle_errors={LOST_GPU: 15}))
    folder = tmp_path / "run"
    # 119 steps an epoch, 4 calls of the layer a step: epoch 2's 31st step.
    environ = train_process.train_env(folder, **FOUR, FAULT="crash", FAULT_AT=str(4 * 150),
                                      FAULT_ONCE=str(tmp_path / "fired"))
    said: list[str] = []
    old = Path.cwd()
    os.chdir(tmp_path)
    try:
        code = _supervised(folder, environ, said)
    finally:
        os.chdir(old)
    log = "\n".join(said)
    assert code == 0, log[-3000:]
    assert "GPU 2 left out (NVML_ERROR_GPU_IS_LOST" in log
    assert re.search(r"3 replica\(s\) of 4 \(global batch 12 kept\), from epoch 2, step \d+",
                     log), log[-3000:]
    assert "recovered: left out GPU 2" in log and "4 -> 3 replicas" in log
    event = train_process.metrics(folder)["recovery"][0]
    assert event["action"] == "gpus_dropped" and list(event["dropped"]) == ["2"]
    assert (event["replicas_from"], event["replicas_to"]) == (4, 3)
    assert (event["per_replica_batch_from"], event["per_replica_batch_to"]) == (3, 4)
    assert event["resumes_from"].startswith("epoch 2, step ") and event["at"].endswith("Z")
    recorded = json.loads((folder / "settings.json").read_text())["settings"]
    assert recorded["VIRTUAL_DEVICES"]["value"] == "3" and recorded["BATCH_SIZE"]["value"] == "4"
    ours, theirs = _history(folder), _history(reference)
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs, strict=True):
        assert abs(a["loss"] - b["loss"]) <= 1e-5, (a, b)
    assert abs(train_process.metrics(folder)["test_loss"]
               - train_process.metrics(reference)["test_loss"]) <= 1e-5
