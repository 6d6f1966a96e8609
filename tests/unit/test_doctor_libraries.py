"""Which CUDA library files TensorFlow really loads, against the NVIDIA wheels its RUNPATH
points to: real fake libraries (gcc), the real loader, a stand-in TensorFlow whose own
shared object dlopens them by soname with or without TensorFlow's RUNPATH."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from mgpu_env.config.resolve import resolve_settings
from mgpu_env.doctor import Diagnosis, diagnose
from mgpu_env.doctor import facts as probes
from mgpu_env.hardware import cudadriver, cudalibs
from mgpu_env.hardware.cudalibs import elf_runpath
from mgpu_env.tfprobes import tfprobe
from tests.support.fake_doctor import healthy_host, versions
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.fakecuda import (
    build_cuda_library,
    build_libcuda,
    build_library,
    build_site,
    needs_gcc,
)

Install = Callable[[FakeNvml], FakeNvml]
pytestmark = needs_gcc
REAL = {"tf": tfprobe.collect, "cuda": cudalibs.collect, "driver": cudadriver.collect}


@pytest.fixture
def machine(use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two healthy GPUs by NVML; the real probes (children) for everything else."""
    use_fake_nvml(fake_with(2, driver_version="555.42.06", cuda_driver_version=12050))
    monkeypatch.setattr(probes, "probe_host", lambda: healthy_host())
    monkeypatch.setattr(probes, "probe_versions", lambda: versions())
    monkeypatch.setattr(tfprobe, "collect", REAL["tf"])
    monkeypatch.setattr(cudalibs, "collect", REAL["cuda"])
    monkeypatch.setattr(cudadriver, "collect", REAL["driver"])


def run(site_root: Path, *ld: Path, runpath: bool = True) -> Diagnosis:
    site = build_site(site_root, runpath=runpath)
    build_libcuda(site_root.parent / "driver", device_count=2)
    env = site.environ({"PATH": os.environ["PATH"]}, LD_LIBRARY_PATH=":".join(
        str(p) for p in (site_root.parent / "driver", *ld)))
    return diagnose(resolve_settings({}, env), env)


def by_id(report: Diagnosis) -> dict[str, object]:
    return {c.id: c for c in report.checks}


def test_the_runpath_is_read_from_the_elf_file(tmp_path: Path) -> None:
    with_it = build_site(tmp_path / "a")
    without = build_site(tmp_path / "b", runpath=False)
    framework = "tensorflow/libtensorflow_framework.so.2"
    assert "$ORIGIN/../nvidia/cudnn/lib" in elf_runpath(with_it.root / framework)
    assert elf_runpath(without.root / framework) == ""


def test_healthy_wheels_are_what_tensorflow_loads(machine: None, tmp_path: Path) -> None:
    report = run(tmp_path / "site")
    checks = by_id(report)
    assert report.verdict().startswith("ready: 2 GPUs"), [
        (c.title, c.found) for c in report.checks if c.status in ("warn", "error")]
    loaded = checks["cuda.loaded"]
    assert loaded.status == "ok" and "none shadowing" in loaded.found  # type: ignore[attr-defined]
    assert report.facts.tensorflow is not None
    assert any(p.endswith("libcudnn.so.9") for p in report.facts.tensorflow.loaded.value or ())


def test_an_old_cuda_folder_shadows_nvjitlink(machine: None, tmp_path: Path) -> None:
    old = tmp_path / "usr" / "local" / "cuda-12.1" / "lib64"
    build_library(old, "libnvJitLink.so.12")  # 12.1: without __nvJitLinkAddData_12_5
    report = run(tmp_path / "site", old)
    checks = by_id(report)
    fix = f"remove {old} from LD_LIBRARY_PATH"
    for name in ("cuda.libraries", "cuda.loaded", "visible.tensorflow"):
        check = checks[name]
        assert check.status == "error", check  # type: ignore[attr-defined]
        assert check.fix.startswith(fix), check  # type: ignore[attr-defined]
    assert "undefined symbol: __nvJitLinkAddData_12_5" in checks["cuda.libraries"].found  # type: ignore[attr-defined]


def test_another_package_s_cudnn_on_ld_library_path(machine: None, tmp_path: Path) -> None:
    other = tmp_path / "venv-torch/lib/python3.12/site-packages/nvidia/cudnn/lib"
    build_cuda_library(other, "cudnn", 90100)
    report = run(tmp_path / "site", other)
    checks = by_id(report)
    cudnn = checks["tensorflow.cudnn"]
    assert cudnn.status == "error" and "9.1.0" in cudnn.found  # type: ignore[attr-defined]
    assert "another Python package's NVIDIA wheel" in cudnn.found  # type: ignore[attr-defined]
    assert cudnn.fix.startswith(f"remove {other} from LD_LIBRARY_PATH")  # type: ignore[attr-defined]
    assert checks["cuda.loaded"].status == "warn"  # type: ignore[attr-defined]


def test_a_runpath_without_the_wheels(machine: None, tmp_path: Path) -> None:
    report = run(tmp_path / "site", runpath=False)
    checks = by_id(report)
    loaded = checks["cuda.loaded"]
    assert loaded.status == "error" and "tensorflow#63362" in loaded.found  # type: ignore[attr-defined]
    assert "export LD_LIBRARY_PATH=" in loaded.fix  # type: ignore[attr-defined]
    assert checks["visible.tensorflow"].fix == loaded.fix  # type: ignore[attr-defined]
