"""`mgpu train` stops before training when the doctor's pre-flight checks fail."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.tfprobes import tfprobe
from tests.support.fake_doctor import tf_facts
from tests.support.fake_nvml import FakeNvml, fake_with


def test_old_driver_stops_training_with_the_fix(
    use_fake_nvml: Callable[[FakeNvml], FakeNvml], monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_with(2, driver_version="470.57.02", cuda_driver_version=11040))
    monkeypatch.setattr(tfprobe, "collect_in_process", lambda: tf_facts(gpus=2))
    result = CliRunner().invoke(app, ["train", "--gpus", "0,1", "--dry-run"])
    assert result.exit_code == 1, result.output
    assert "pre-flight check failed" in result.stderr
    assert "470.57.02" in result.stderr and "Fix:" in result.stderr
    assert "Traceback" not in result.output


def test_tensorflow_seeing_fewer_gpus_than_asked_stops_training(
    use_fake_nvml: Callable[[FakeNvml], FakeNvml], monkeypatch: pytest.MonkeyPatch
) -> None:
    use_fake_nvml(fake_with(2))
    monkeypatch.setattr(tfprobe, "collect_in_process", lambda: tf_facts(gpus=1))
    result = CliRunner().invoke(app, ["train", "--gpus", "0,1", "--dry-run"])
    assert result.exit_code == 1, result.output
    assert "pre-flight check failed" in result.stderr


def test_healthy_machine_passes_preflight(
    use_fake_nvml: Callable[[FakeNvml], FakeNvml], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_env.config.resolve import resolve_settings
    from mgpu_env.doctor import preflight
    from mgpu_env.runtime import build_runtime

    use_fake_nvml(fake_with(2))
    monkeypatch.setattr(tfprobe, "collect_in_process", lambda: tf_facts(gpus=2))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    runtime = build_runtime(resolve_settings({"GPUS": "0,1"}, {}), command="train")
    runtime.apply()
    assert preflight(runtime) == []
