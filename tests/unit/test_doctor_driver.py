"""CUDA's driver API probe against real fake libcuda.so.1 files (gcc, the real loader via
LD_LIBRARY_PATH), and the doctor's verdict on each result code users meet."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mgpu_env.config.resolve import resolve_settings
from mgpu_env.doctor import Facts, gather
from mgpu_env.doctor.checks import check_cuda_driver, check_device_files
from mgpu_env.hardware import cudaerrors
from mgpu_env.hardware.cudadriver import collect as real_collect
from tests.support.fake_doctor import make_facts, tf_facts
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.fakecuda import build_libcuda, needs_gcc
from tests.support.fakemachine import FakeHost, Machine

Install = Callable[[FakeNvml], FakeNvml]
MakeMachine = Callable[..., FakeHost]
pytestmark = needs_gcc


def environ(*folders: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["LD_LIBRARY_PATH"] = ":".join(str(f) for f in folders)
    env.update(extra)
    return env


@pytest.mark.parametrize("code", [0, 2, 35, 46, 100, 803, 804, 999])
def test_the_probe_reports_cuinit_s_code_and_the_file(tmp_path: Path, code: int) -> None:
    library = build_libcuda(tmp_path / "lib", init_code=code, driver_version=12080,
                            device_count=2)
    probed = real_collect(environ(tmp_path / "lib"))
    assert probed.ok, probed.error
    api = probed.value
    assert api is not None and api.library == str(library)
    assert api.init_code == code and api.driver_version == 12080 and api.cuda_version == "12.8"
    assert api.device_count == (2 if code == 0 else None)


def test_no_libcuda_says_so(tmp_path: Path) -> None:
    # An empty LD_LIBRARY_PATH folder: on a machine without a driver nothing else has one.
    probed = real_collect(environ(tmp_path))
    assert probed.ok and probed.value is not None
    if probed.value.library is None:
        assert "libcuda.so.1" in (probed.value.load_error or "")


def test_the_loader_takes_ld_library_path_first(tmp_path: Path) -> None:
    build_libcuda(tmp_path / "cuda-12.8" / "compat", init_code=804)
    build_libcuda(tmp_path / "driver", init_code=0)
    first = real_collect(environ(tmp_path / "cuda-12.8" / "compat", tmp_path / "driver"))
    assert first.value is not None and first.value.init_code == 804
    assert "/compat/" in (first.value.library or "")
    second = real_collect(environ(tmp_path / "driver", tmp_path / "cuda-12.8" / "compat"))
    assert second.value is not None and second.value.init_code == 0


def test_a_hung_cuinit_times_out(tmp_path: Path) -> None:
    build_libcuda(tmp_path / "lib", hang_s=30)
    start = time.monotonic()
    probed = real_collect(environ(tmp_path / "lib"), timeout_s=1.0)
    assert time.monotonic() - start < 10
    assert not probed.ok and "did not return within 1 s" in (probed.error or "")


# ------------------------------------------------------------------------- the verdict


def facts_of(fake_machine: MakeMachine, code: int, *, folder: str = "driver",
             count: int | None = None, machine: Machine | None = None) -> Facts:
    """The doctor's facts on a fake machine (two GPUs unless `machine` says otherwise) whose
    libcuda.so.1, in `folder`, answers cuInit with `code` (the real probe child loads it)."""
    machine = machine or Machine()
    host = fake_machine(machine, libcuda={"init_code": code, "device_count": len(
        machine.usable) if count is None else count}, libcuda_folder=folder)
    return gather(resolve_settings({"GPUS": "all"}, host.environ), host.environ,
                  with_tensorflow=False)


def judged(fake_machine: MakeMachine, code: int, **options: Any) -> tuple[str, str, str]:
    check = check_cuda_driver(facts_of(fake_machine, code, **options))
    return check.status, check.found, check.fix


def test_success_is_ok(fake_machine: MakeMachine) -> None:
    status, found, _ = judged(fake_machine, 0)
    assert status == "ok" and "cuInit ok, 2 GPU(s)" in found


def test_unknown_error_on_a_host_without_nvidia_uvm(fake_machine: MakeMachine) -> None:
    status, found, fix = judged(fake_machine, 999, machine=Machine(
        modules=("nvidia", "nvidia_modeset")))
    assert status == "error" and "CUDA_ERROR_UNKNOWN" in found
    assert "nvidia_uvm NOT loaded" in found
    assert fix == cudaerrors.FIX_UVM and "nvidia-modprobe -u -c=0" in fix


def test_unknown_error_in_a_container_without_dev_nvidia_uvm(
        fake_machine: MakeMachine) -> None:
    facts = facts_of(fake_machine, 999, machine=Machine(container=True,
                                                        missing=("nvidia-uvm",)))
    check = check_cuda_driver(facts)
    assert check.status == "error" and "no /dev/nvidia-uvm" in check.found
    assert check.fix == cudaerrors.FIX_UVM_CONTAINER
    assert check_device_files(facts).status == "warn"


@pytest.mark.parametrize("code", [803, 804])
def test_forward_compatibility_from_a_compat_folder(fake_machine: MakeMachine,
                                                    code: int) -> None:
    status, found, fix = judged(fake_machine, code, folder="usr/local/cuda-12.8/compat")
    assert status == "error" and cudaerrors.name(code) in found
    assert "forward-compatibility library" in found and fix == cudaerrors.FIX_COMPAT


@pytest.mark.parametrize(("code", "words"), [
    (100, "CUDA sees no GPU"), (35, "driver is older"), (2, "another process holds it"),
    (46, "exclusive-process"), (34, "stub"), (802, "fabric manager")])
def test_each_code_has_its_cause_and_fix(fake_machine: MakeMachine, code: int,
                                         words: str) -> None:
    status, found, fix = judged(fake_machine, code)
    assert status == "error" and words in found and fix == cudaerrors.describe(code).fix


def test_fewer_gpus_than_nvml(fake_machine: MakeMachine) -> None:
    status, found, _ = judged(fake_machine, 0, count=1)
    assert status == "error" and "asks for 2 (NVML lists 2)" in found


def test_probed_without_gpus_but_skipped_on_a_cpu_machine(use_fake_nvml: Install) -> None:
    # Issue 33: the driver API is always asked, NVML or not; a machine without any NVIDIA
    # GPU (NVML, the PCI bus, /proc) is no fault of CUDA's.
    use_fake_nvml(fake_with(0))
    facts = make_facts("all", tf=tf_facts(0))
    check = check_cuda_driver(facts)
    assert facts.cuda_driver is not None and check.status == "skip"
    assert check.found == "cuInit ok (no NVIDIA GPU on this machine)"
