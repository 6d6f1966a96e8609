"""`mgpu train` stops before training when the doctor's pre-flight checks fail."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.doctor import facts as probes
from mgpu_env.hardware import nvidiahost
from mgpu_env.hardware.nvml import Probed
from mgpu_env.tfprobes import tfprobe
from tests.support.fake_doctor import tf_facts
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.fakemachine import machine_root


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


def _gpu_machine_without_nvml(
    use_fake_nvml: Callable[[FakeNvml], FakeNvml], monkeypatch: pytest.MonkeyPatch,
    root: Path,
) -> None:
    """Two NVIDIA GPUs on the PCI bus, a driver upgraded without a reboot: NVML answers
    LIB_RM_VERSION_MISMATCH (issue 33: such a machine never trains on the CPU by mistake)."""
    machine_root(root, kernel="550.54.15", library="550.90.07")
    use_fake_nvml(FakeNvml(init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    monkeypatch.setattr(probes, "probe_nvidia_host", lambda: nvidiahost.collect(root))
    monkeypatch.setattr(probes, "probe_in_container", lambda: Probed(value=False))


def test_a_gpu_machine_whose_gpus_cannot_be_used_stops_mgpu_train(
    use_fake_nvml: Callable[[FakeNvml], FakeNvml], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    _gpu_machine_without_nvml(use_fake_nvml, monkeypatch, tmp_path / "machine")
    result = CliRunner().invoke(app, ["train", "--dry-run"], env={"GPUS": "all"})
    assert result.exit_code == 1, result.output
    assert "pre-flight check failed: Driver (NVML)" in result.stderr
    assert "2 NVIDIA GPU(s) on this machine" in result.stderr
    assert "Fix: reboot" in result.stderr and "Traceback" not in result.output
    on_purpose = CliRunner().invoke(app, ["train", "--dry-run"], env={"GPUS": "none"})
    assert on_purpose.exit_code == 0, on_purpose.output
    assert "GPUS=none" in on_purpose.output


def test_a_gpu_machine_whose_gpus_cannot_be_used_stops_mgpu_run(
    use_fake_nvml: Callable[[FakeNvml], FakeNvml], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    _gpu_machine_without_nvml(use_fake_nvml, monkeypatch, tmp_path / "machine")
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    result = CliRunner().invoke(app, ["run", str(script)], env={"GPUS": "all"})
    assert result.exit_code == 1, result.output
    assert "none usable" in result.stderr and not marker.exists()
