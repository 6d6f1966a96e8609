"""The container's view: NVIDIA_DRIVER_CAPABILITIES walked over every capability the toolkit
knows, NVIDIA_VISIBLE_DEVICES over its kinds of value, and libcuda.so.1 missing where NVML
answers (the `utility`-only container)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mgpu_env.doctor.checks import check_container_view, check_cuda_driver
from mgpu_env.doctor.checks.containerview import CAPABILITIES, FIX_COMPUTE
from mgpu_env.hardware import cudadriver
from mgpu_env.hardware.nvml import Probed
from tests.support.fake_doctor import driver_api, healthy_host, make_facts
from tests.support.fake_nvml import FakeNvml, fake_with

Install = Callable[[FakeNvml], FakeNvml]


def _check(environ: dict[str, str], setting: str = "all") -> object:
    return check_container_view(make_facts(setting, environ=environ))


@pytest.mark.parametrize("value", [*CAPABILITIES, "compute,utility", "utility,compute",
                                   "ALL", None])
def test_every_capability_value(use_fake_nvml: Install, value: str | None) -> None:
    use_fake_nvml(fake_with(2))
    check = _check({} if value is None else {"NVIDIA_DRIVER_CAPABILITIES": value})
    words = set((value or "utility,compute").lower().split(","))
    if "all" in words or {"compute", "utility"} <= words:
        assert check.status == "ok"  # type: ignore[attr-defined]
    elif "compute" in words:
        assert check.status == "warn" and "no `utility`" in check.found  # type: ignore[attr-defined]
    else:
        assert check.status == "error" and check.fix == FIX_COMPUTE  # type: ignore[attr-defined]


def test_an_unknown_capability(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1))
    check = _check({"NVIDIA_DRIVER_CAPABILITIES": "compute,utility,cuda"})
    assert check.status == "warn" and "cuda is not a capability" in check.found  # type: ignore[attr-defined]


@pytest.mark.parametrize(("value", "status", "words"), [
    ("all", "ok", ""), ("0,1", "ok", ""), ("GPU-00000000", "ok", ""),
    ("void", "warn", "`void`"), ("none", "warn", "`none`"),
    ("GPU-deadbeef", "warn", "gpu-deadbeef, which this container does not have"),
    ("0,7", "warn", "names 7,"), ("MIG-1234", "warn", "mig-1234"),
])
def test_visible_devices(use_fake_nvml: Install, value: str, status: str, words: str) -> None:
    use_fake_nvml(fake_with(2))
    check = _check({"NVIDIA_VISIBLE_DEVICES": value})
    assert check.status == status and words in check.found  # type: ignore[attr-defined]


def test_void_with_no_gpu_is_an_error(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(0))
    check = _check({"NVIDIA_VISIBLE_DEVICES": "void"})
    assert check.status == "error" and "GPUS=none" in check.fix  # type: ignore[attr-defined]


def test_skipped_outside_a_container_and_for_the_cpu(use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_with(1))
    facts = make_facts("all", host=healthy_host(in_container=Probed(value=False)),
                       environ={"NVIDIA_DRIVER_CAPABILITIES": "utility"})
    assert check_container_view(facts).status == "skip"
    assert _check({"NVIDIA_DRIVER_CAPABILITIES": "utility"}, setting="none").status == "skip"  # type: ignore[attr-defined]


def test_nvml_without_libcuda_is_the_capabilities_fault(
    use_fake_nvml: Install, monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_fake_nvml(fake_with(2))
    monkeypatch.setattr(cudadriver, "collect",
                        lambda environ, timeout_s=0: driver_api(library=None))
    facts = make_facts("all", environ={"NVIDIA_DRIVER_CAPABILITIES": "utility"})
    check = check_cuda_driver(facts)
    assert check.status == "error" and check.fix == FIX_COMPUTE
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in check.found
