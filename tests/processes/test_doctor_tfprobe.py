"""The TensorFlow probe: parsing its answers, the child process, and (slow) the real thing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mgpu_env.hardware.nvml import Probed
from mgpu_env.tfprobes import tfprobe
from tests.support.fake_doctor import tf_facts


@pytest.mark.parametrize(
    ("encoded", "text"), [(90300, "9.3.0"), (90800, "9.8.0"), (91002, "9.10.2"), (8902, "8.9.2")]
)
def test_decode_cudnn_version(encoded: int, text: str) -> None:
    assert tfprobe.decode_cudnn_version(encoded) == text


def test_build_info_from_the_real_shape() -> None:
    raw = {
        "cpu_compiler": "clang",
        "cuda_compute_capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"],
        "cuda_version": "12.5.1",
        "cudnn_version": "9",
        "is_cuda_build": True,
        "is_rocm_build": False,
        "is_tensorrt_build": False,
    }
    info = tfprobe.build_info_from(raw)
    assert info.is_cuda_build and info.cuda_version == "12.5.1" and info.cudnn_version == "9"
    assert info.compute_capabilities[-1] == "compute_90"


def test_build_info_from_a_cpu_build() -> None:
    info = tfprobe.build_info_from({"is_cuda_build": False, "is_rocm_build": False})
    assert not info.is_cuda_build and info.cuda_version is None
    assert info.compute_capabilities == ()


def test_json_round_trip() -> None:
    for facts in (tf_facts(2), tf_facts(0, cudnn=None), tfprobe.failed("boom", {"A": "1"})):
        assert tfprobe.from_json(tfprobe.to_json(facts)) == facts


def test_child_that_crashes_is_could_not_collect(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\necho 'Segmentation fault' >&2\nexit 139\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    facts = tfprobe.collect({"CUDA_VISIBLE_DEVICES": "0"})
    assert not facts.version.ok and not facts.gpus.ok
    assert "exited with code 139" in (facts.gpus.error or "")
    assert "Segmentation fault" in (facts.gpus.error or "")
    assert facts.environment == {"CUDA_VISIBLE_DEVICES": "0"}


def test_child_that_hangs_times_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nsleep 5\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    facts = tfprobe.collect({}, timeout_s=0.2)
    assert "did not answer within 0.2 s" in (facts.build.error or "")


def test_no_cudnn_says_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tfprobe, "_mapped_libraries", lambda prefix: [])
    monkeypatch.setattr(tfprobe, "_pip_cudnn_candidates", lambda: ["/nowhere/libcudnn.so.9"])
    monkeypatch.setenv("LD_LIBRARY_PATH", "/nowhere")
    try:
        library = tfprobe.loaded_cudnn()
    except RuntimeError as err:
        assert "/nowhere/libcudnn.so.9" in str(err)
    else:  # a machine with cuDNN installed system-wide
        assert library.version.startswith(("8.", "9."))


def test_num_gpus() -> None:
    assert tf_facts(3).num_gpus == 3
    assert tfprobe.TfFacts(gpus=Probed(error="x")).num_gpus is None


@pytest.mark.slow
def test_real_tensorflow_in_a_child() -> None:
    """Imports the real TensorFlow (seconds). On a machine without GPUs it lists none."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="-1")
    facts = tfprobe.collect(env, timeout_s=240)
    assert facts.version.value == "2.21.0", facts
    assert facts.build.ok and facts.build.value is not None
    # The Linux pip wheel is a CUDA build even where no GPU exists.
    assert facts.build.value.is_cuda_build
    assert facts.build.value.cuda_version and facts.build.value.cuda_version.startswith("12.5")
    assert facts.num_gpus == 0
    assert facts.environment["CUDA_VISIBLE_DEVICES"] == "-1"
