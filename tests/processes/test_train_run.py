"""`mgpu train` end to end, in subprocesses: replicas, learning, kill -9, SIGTERM, bad input.

Each run is its own process because splitting the CPU into logical devices must happen
before TensorFlow initialises, once per process. Digits (built in, offline) keeps every
run to a few seconds.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from mgpu_env.runtime.precision import choose_precision
from tests.support.train_process import metrics, run, start, wait_for_epochs

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_trains_with_that_many_replicas_and_learns(tmp_path: Path, replicas: int) -> None:
    output = tmp_path / "run"
    # The same global batch (64) for every replica count, so each learns as fast.
    result = run(output, VIRTUAL_DEVICES=str(replicas), BATCH_SIZE=str(64 // replicas),
                 EPOCHS="5")
    assert result.returncode == 0, result.stderr
    assert f"replicas       {replicas} (mirrored)" in result.stdout
    found = metrics(output)
    assert found["replicas"] == replicas and len(found["devices"]) == replicas
    assert found["global_batch_size"] == 64
    assert found["epochs_completed"] == 5 and found["resumed_from_epoch"] == 0
    assert [e["epoch"] for e in found["history"]] == [1, 2, 3, 4, 5]
    assert found["test_accuracy"] >= 0.9, found["test_accuracy"]
    assert (output / "model.keras").is_file() and list((output / "logs").iterdir())
    assert "Done: test accuracy" in result.stdout
    # Each time says which it is: the epochs' time, or the wall time with the start-up.
    assert "training time" in result.stdout and "(the epochs)" in result.stdout
    assert "wall time" in result.stdout and "(start-up included)" in result.stdout
    assert 0 < found["training_time_s"] < found["wall_time_s"]


def test_fp16_with_xla_and_loss_scaling_learns_on_two_replicas(tmp_path: Path) -> None:
    # Only the forward and backward pass is jit-compiled; the all-reduce and the
    # LossScaleOptimizer's update run outside XLA, where merge_call works.
    output = tmp_path / "run"
    result = run(output, VIRTUAL_DEVICES="2", BATCH_SIZE="32", EPOCHS="5",
                 MIXED_PRECISION="fp16", XLA="1")
    assert result.returncode == 0, result.stderr
    found = metrics(output)
    assert found["precision_policy"] == "mixed_float16" and found["replicas"] == 2
    assert found["xla"] is True and found["test_accuracy"] >= 0.85, found["test_accuracy"]


def test_kill_9_mid_training_then_rerun_resumes_and_finishes(tmp_path: Path) -> None:
    output = tmp_path / "run"
    settings = {"EPOCHS": "25", "VIRTUAL_DEVICES": "2", "BATCH_SIZE": "32"}
    # Two hard kills at different moments (mid-epoch, or mid-save), then a clean finish.
    for epochs_before_kill, extra_delay in ((3, 0.0), (7, 0.05)):
        process = start(output, **settings)
        wait_for_epochs(output, process, epochs_before_kill)
        time.sleep(extra_delay)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        assert not (output / "metrics.json").exists()
    result = run(output, **settings)
    assert result.returncode == 0, result.stderr
    found = metrics(output)
    assert found["resumed_from_epoch"] >= 7 and found["epochs_completed"] == 25
    assert [e["epoch"] for e in found["history"]] == list(range(1, 26))
    assert "resumes after epoch" in result.stdout
    assert found["test_accuracy"] >= 0.9


def test_sigterm_saves_says_how_to_resume_and_exits_143(tmp_path: Path) -> None:
    output = tmp_path / "run"
    process = start(output, EPOCHS="200")
    wait_for_epochs(output, process, 2)
    process.send_signal(signal.SIGTERM)
    _stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert "SIGTERM received" in stderr and f"OUTPUT_DIR={output} mgpu train" in stderr
    assert "Traceback" not in stderr
    assert not (output / "metrics.json").exists()
    checkpoints = sorted(p.name for p in (output / "checkpoints").glob("ckpt-*.index"))
    assert checkpoints, "the last completed epoch's checkpoint is kept"

    # A corrupt checkpoint is refused (exit 2), never silently replaced by a fresh start.
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-r", str(output), str(broken)], check=True)
    for data_file in (broken / "checkpoints").glob("ckpt-*.data-*"):
        data_file.write_bytes(b"garbage")
    result = run(broken, EPOCHS="200")
    assert result.returncode == 2, result.stderr
    assert "cannot be resumed as it is" in result.stderr and "Traceback" not in result.stderr
    assert "No complete checkpoint is left" in result.stderr  # every one of them damaged

    # The interrupted run resumes to the end (fewer epochs this time: EPOCHS may change).
    resumed_at = int(checkpoints[-1].split("-")[1].split(".")[0])
    result = run(output, EPOCHS=str(resumed_at + 2))
    assert result.returncode == 0, result.stderr
    assert metrics(output)["resumed_from_epoch"] == resumed_at


def test_finished_run_is_kept_and_other_settings_are_refused(tmp_path: Path) -> None:
    output = tmp_path / "run"
    assert run(output, EPOCHS="1").returncode == 0
    before = (output / "metrics.json").read_text()
    again = run(output, EPOCHS="1")
    assert again.returncode == 0 and "Nothing to do: " in again.stdout, again.stderr
    refused = run(output, EPOCHS="1", LEARNING_RATE="0.01")
    assert refused.returncode == 2 and "these settings would change" in refused.stderr
    assert "LEARNING_RATE: 0.001 there, 0.01 now" in refused.stderr
    assert (output / "metrics.json").read_text() == before


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path) -> None:
    output = tmp_path / "run"
    result = run(output, "--dry-run", VIRTUAL_DEVICES="2", MIXED_PRECISION="1")
    assert result.returncode == 0, result.stderr
    # MIXED_PRECISION=1 on the CPU is bf16 where it has bf16 instructions, else float32.
    policy = choose_precision("1", "CPU").policy
    for expected in ("replicas       2", "64 per replica, 128 global", policy,
                     "reduction_to_one", "digits", str(output)):
        assert expected in result.stdout
    assert not output.exists()


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").is_file(),
    reason="needs Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist)",
)
def test_fashion_mnist_from_the_debian_package_reaches_the_seeds_accuracy(
    tmp_path: Path,
) -> None:
    output = tmp_path / "run"
    result = run(output, DATASET="fashion_mnist", EPOCHS="5")
    assert result.returncode == 0, result.stderr
    assert "/usr/share/datasets/fashion-mnist" in result.stdout
    found = metrics(output)
    assert found["train_samples"] == 60_000 and found["test_samples"] == 10_000
    assert found["test_accuracy"] >= 0.85, found["test_accuracy"]  # the seed: about 0.87


def test_corrupt_mnist_npz_is_exit_2_without_traceback(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "mnist.npz").write_bytes(b"PK\x03\x04 truncated")
    result = run(tmp_path / "run", DATASET="auto", DATA_DIR=str(data_dir))
    assert result.returncode == 2, result.stderr
    assert "mnist.npz" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_a_run_killed_and_resumed_has_the_uninterrupted_runs_losses_to_the_bit(
    tmp_path: Path,
) -> None:
    settings = {"EPOCHS": "6", "VIRTUAL_DEVICES": "2", "BATCH_SIZE": "32"}
    straight = tmp_path / "straight" / "run"
    straight.parent.mkdir()
    assert run(straight, **settings).returncode == 0
    resumed = tmp_path / "resumed" / "run"
    resumed.parent.mkdir()
    process = start(resumed, **settings)
    # Three epochs in history.json: the checkpoint of the second is complete.
    wait_for_epochs(resumed, process, 3)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert not (resumed / "metrics.json").exists()
    result = run(resumed, **settings)
    assert result.returncode == 0, result.stderr
    found, expected = metrics(resumed), metrics(straight)
    assert 2 <= found["resumed_from_epoch"] < 6
    # Each epoch's order comes from (SEED, epoch) alone, so the resumed epochs see the
    # batches the uninterrupted run saw, and the CPU computes the same floats.
    for key in ("loss", "accuracy"):
        assert [e[key] for e in found["history"]] == [e[key] for e in expected["history"]]
    assert found["test_loss"] == expected["test_loss"]
