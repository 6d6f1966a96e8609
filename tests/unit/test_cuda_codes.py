"""The model of CUDA's driver API result codes (`cudaerrors`), walked code by code through
the doctor's cuInit check: every CUresult the table knows gets its own cause and fix, also
when NVML fails (the driver API is asked NVML or not)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from mgpu_env.doctor.checks import check_cuda_driver
from mgpu_env.hardware import cudadriver, cudaerrors, nvidiahost
from mgpu_env.hardware.nvml import Probed
from tests.support.fake_doctor import driver_api, healthy_host, make_facts
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.fakemachine import machine_root

Install = Callable[[FakeNvml], FakeNvml]
FAILING = sorted(code for code in cudaerrors.ERRORS if code)
GENERIC = "see cuda.h's CUresult"


def test_names_and_codes_agree() -> None:
    assert len(FAILING) >= 23
    for code, error in cudaerrors.ERRORS.items():
        assert error.name.startswith("CUDA_") and cudaerrors.BY_NAME[error.name] == code
        assert code == 0 or (error.cause and error.fix)
    assert GENERIC in cudaerrors.describe(4242).fix


@pytest.mark.parametrize("code", FAILING, ids=[cudaerrors.name(c) for c in FAILING])
@pytest.mark.parametrize("nvml_works", [True, False], ids=["nvml", "no-nvml"])
def test_every_cuinit_code_has_its_cause_and_fix(
    code: int, nvml_works: bool, use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    use_fake_nvml(fake_with(2) if nvml_works else
                  FakeNvml(init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    monkeypatch.setattr(cudadriver, "collect",
                        lambda environ, timeout_s=0: driver_api(init_code=code))
    host = healthy_host(nvidia=nvidiahost.collect(machine_root(tmp_path, library=None)),
                        in_container=Probed(value=False))
    check = check_cuda_driver(make_facts("all", host=host))
    assert check.status == "error"
    assert f"cuInit(0) = {code} {cudaerrors.name(code)}" in check.found
    assert GENERIC not in check.fix and check.fix
    assert cudaerrors.describe(code).cause.split(" (")[0] in check.found


def test_a_driver_upgraded_without_reboot_names_both_versions(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    use_fake_nvml(fake_with(1))
    library = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07"
    monkeypatch.setattr(cudadriver, "collect", lambda environ, timeout_s=0: driver_api(
        init_code=803, library=library))
    host = healthy_host(nvidia=nvidiahost.collect(machine_root(tmp_path, kernel="550.54.15")))
    check = check_cuda_driver(make_facts("all", host=host))
    assert f"the kernel module is 550.54.15, {library} is 550.90.07" in check.found
    assert check.fix == cudaerrors.FIX_DRIVER_MISMATCH
