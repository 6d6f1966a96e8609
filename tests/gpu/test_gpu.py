"""On real GPUs: what the CPU tests cannot show (the GPU device path, NCCL, tensor cores).

Every test here is marked `gpu` and is skipped, with the reason, where NVML lists no GPU;
on a GPU machine `pytest -m gpu` runs them (a few minutes on one GPU). Each run is its own
process, as a user's would be, on the built-in digits (offline).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpu_env.hardware import nvml
from tests.support.run_process import mgpu
from tests.support.train_process import metrics, run

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def gpu_count() -> int:
    return len(nvml.snapshot().listing.gpus)


def test_train_uses_every_gpu_and_learns(tmp_path: Path) -> None:
    output = tmp_path / "run"
    result = run(output, GPUS="all", EPOCHS="3")
    assert result.returncode == 0, result.stderr
    found = metrics(output)
    assert found["device_type"] == "GPU" and found["replicas"] == gpu_count()
    assert all("GPU" in device for device in found["devices"])
    assert found["test_accuracy"] >= 0.9, found["test_accuracy"]


def test_mixed_precision_picks_a_16_bit_policy_and_still_learns(tmp_path: Path) -> None:
    # MIXED_PRECISION=1: fp16 (with loss scaling) or bf16 on a GPU with tensor cores.
    output = tmp_path / "run"
    result = run(output, GPUS="0", MIXED_PRECISION="1", EPOCHS="3")
    assert result.returncode == 0, result.stderr
    found = metrics(output)
    assert found["precision_policy"] in ("mixed_float16", "mixed_bfloat16")
    assert found["test_accuracy"] >= 0.9, found["test_accuracy"]


def test_one_gpu_split_in_two_trains_two_replicas_with_xla(tmp_path: Path) -> None:
    output = tmp_path / "run"
    result = run(output, GPUS="0", VIRTUAL_DEVICES="2", BATCH_SIZE="32", XLA="1", EPOCHS="2")
    assert result.returncode == 0, result.stderr
    found = metrics(output)
    assert found["replicas"] == 2 and found["device_type"] == "GPU" and found["xla"] is True


def test_a_stopped_gpu_run_resumes_to_the_same_epochs(tmp_path: Path) -> None:
    output = tmp_path / "run"
    first = run(output, GPUS="0", EPOCHS="1")
    assert first.returncode == 0, first.stderr
    again = run(output, GPUS="0", EPOCHS="2")
    assert again.returncode == 0, again.stderr
    found = metrics(output)
    assert found["resumed_from_epoch"] == 1 and found["epochs_completed"] == 2


def test_bench_measures_the_gpus(tmp_path: Path) -> None:
    output = tmp_path / "bench"
    result = mgpu(tmp_path, [], "bench", GPUS="0", BENCH_REPLICAS="1", BENCH_WARMUP="2",
                  BENCH_STEPS="5", BENCH_INTERVALS="2", BENCH_DATA="both",
                  OUTPUT_DIR=str(output))
    assert result.returncode == 0, result.stderr
    points = json.loads((output / "bench.json").read_text())["points"]
    assert points and all(p["samples_per_s"]["median"] > 0 for p in points)
