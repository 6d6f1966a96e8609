"""The container's view: NVIDIA_DRIVER_CAPABILITIES walked over every capability the toolkit
knows, NVIDIA_VISIBLE_DEVICES over its kinds of value, and libcuda.so.1 missing where NVML
answers (the `utility`-only container). The container is a fake machine (`fake_machine`:
/.dockerenv, its /proc, /sys and /dev under MGPU_HOST_ROOT), not a replaced host probe."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mgpu_env.config.resolve import resolve_settings
from mgpu_env.doctor import Check, gather
from mgpu_env.doctor.checks import check_container_view, check_cuda_driver
from mgpu_env.doctor.checks.containerview import CAPABILITIES, FIX_COMPUTE
from mgpu_env.hardware import cudadriver
from tests.support.fake_doctor import driver_api, make_facts
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.fakemachine import FakeHost, Machine, bus_ids

Install = Callable[[FakeNvml], FakeNvml]


@pytest.fixture
def judge(fake_machine: Callable[..., FakeHost]) -> Callable[..., Check]:
    """The container view's verdict in a container (a fake machine with `gpus` GPUs)."""

    def run(environ: dict[str, str], setting: str = "all", *, gpus: int = 2,
            container: bool = True) -> Check:
        host = fake_machine(Machine(gpus=bus_ids(gpus), container=container))
        env = {**host.environ, **environ}
        return check_container_view(gather(resolve_settings({"GPUS": setting}, env), env,
                                           with_tensorflow=False))

    return run


@pytest.mark.parametrize("value", [*CAPABILITIES, "compute,utility", "utility,compute",
                                   "ALL", None])
def test_every_capability_value(judge: Callable[..., Check], value: str | None) -> None:
    check = judge({} if value is None else {"NVIDIA_DRIVER_CAPABILITIES": value})
    words = set((value or "utility,compute").lower().split(","))
    if "all" in words or {"compute", "utility"} <= words:
        assert check.status == "ok"
    elif "compute" in words:
        assert check.status == "warn" and "no `utility`" in check.found
    else:
        assert check.status == "error" and check.fix == FIX_COMPUTE


def test_an_unknown_capability(judge: Callable[..., Check]) -> None:
    check = judge({"NVIDIA_DRIVER_CAPABILITIES": "compute,utility,cuda"}, gpus=1)
    assert check.status == "warn" and "cuda is not a capability" in check.found


@pytest.mark.parametrize(("value", "status", "words"), [
    ("all", "ok", ""), ("0,1", "ok", ""), ("GPU-00000000", "ok", ""),
    ("void", "warn", "`void`"), ("none", "warn", "`none`"),
    ("GPU-deadbeef", "warn", "gpu-deadbeef, which this container does not have"),
    ("0,7", "warn", "names 7,"), ("MIG-1234", "warn", "mig-1234"),
])
def test_visible_devices(judge: Callable[..., Check], value: str, status: str,
                        words: str) -> None:
    check = judge({"NVIDIA_VISIBLE_DEVICES": value})
    assert check.status == status and words in check.found


def test_void_with_no_gpu_is_an_error(judge: Callable[..., Check]) -> None:
    check = judge({"NVIDIA_VISIBLE_DEVICES": "void"}, gpus=0)
    assert check.status == "error" and "GPUS=none" in check.fix


def test_skipped_outside_a_container(judge: Callable[..., Check]) -> None:
    check = judge({"NVIDIA_DRIVER_CAPABILITIES": "utility"}, gpus=1, container=False)
    assert check.status == "skip"


def test_skipped_for_the_cpu(judge: Callable[..., Check]) -> None:
    assert judge({"NVIDIA_DRIVER_CAPABILITIES": "utility"}, setting="none").status == "skip"


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
