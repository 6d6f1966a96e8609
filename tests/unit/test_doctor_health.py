"""GPU health in nvidia-smi's words, from the fake NVML: every field walked healthy, faulty
and not supported."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mgpu_env.doctor.checks import check_health, check_uniform
from mgpu_env.doctor.facts import Facts
from tests.support.fake_nvml import FakeGpu, FakeNvml, fake_gpus

Install = Callable[[FakeNvml], FakeNvml]
MachineFacts = Callable[..., Facts]
RETIREMENT = ("nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows")
QUERIES = ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetDisplayActive",
           "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetCurrentClocksEventReasons",
           "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth")


def _judged(use_fake_nvml: Install, machine_facts: MachineFacts, setting: str = "all",
            **gpu: Any) -> Any:
    use_fake_nvml(fake_gpus([FakeGpu(), FakeGpu(**gpu)]))
    checks = check_health(machine_facts(setting))
    assert isinstance(checks, list) and checks[0].status == "ok"
    return checks[1]


@pytest.mark.parametrize(("gpu", "status", "words", "fix"), [
    ({"ecc_volatile": 3}, "error", "Volatile Uncorrectable ECC errors: 3", "nvidia-smi -r -i 1"),
    ({"ecc_aggregate": 2}, "warn", "Aggregate Uncorrectable ECC errors: 2", "-d ECC"),
    ({"retired_pending": True}, "error", "Retired Pages: Pending Page Blacklist: Yes",
     "retires the pages"),
    ({"remapped": (0, 1, True, False)}, "error", "Remapped Rows: Pending: Yes", "reboot"),
    ({"remapped": (0, 1, False, True)}, "error", "Remapping Failure Occurred: Yes",
     "replacing"),
    ({"display_active": True}, "warn", "Display Active: Enabled", "CUDA_ERROR_LAUNCH_TIMEOUT"),
    ({"persistence": False}, "warn", "Persistence Mode: Disabled", "nvidia-smi -pm 1"),
    ({"clock_events": 0x40 | 0x1}, "warn", "Clocks Event Reasons: HW Thermal Slowdown",
     "cooling"),
    ({"clock_events": 0x4}, "warn", "SW Power Cap", "-pl <watts>"),
    ({"clock_events": 0x8 | 0x80}, "warn", "HW Slowdown, HW Power Brake Slowdown", "power"),
    ({"pcie": (4, 16), "pcie_current": (1, 1)}, "warn",
     "PCIe Link Width: Current x1, Max x16", "riser"),
])
def test_each_fault(machine_facts: MachineFacts, use_fake_nvml: Install, gpu: dict[str, Any],
                    status: str, words: str, fix: str) -> None:
    check = _judged(use_fake_nvml, machine_facts, **gpu)
    assert (check.status, check.title) == (status, "GPU 1 health")
    assert words in check.found and fix in check.fix


@pytest.mark.parametrize("bit", [0x1, 0x2, 0x10, 0x100])
def test_clock_reasons_that_are_not_slowdowns(
        machine_facts: MachineFacts, use_fake_nvml: Install, bit: int) -> None:
    assert _judged(use_fake_nvml, machine_facts, clock_events=bit).status == "ok"


def test_a_gen1_link_at_idle_is_no_fault(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    # GPUs drop the PCIe generation when idle to save power; the width stays.
    assert _judged(use_fake_nvml, machine_facts, pcie=(4, 16), pcie_current=(1, 16)).status == "ok"


@pytest.mark.parametrize("queries", [{q} for q in QUERIES] + [set(RETIREMENT)])
def test_not_supported_is_could_not_collect(
        machine_facts: MachineFacts, use_fake_nvml: Install, queries: set[str]) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(ecc_volatile=0)], unsupported=queries))
    check = check_health(machine_facts("all"))[0]  # type: ignore[index]
    assert check.status == "ok" and "could not collect (Not Supported)" in check.found


@pytest.mark.parametrize("query", RETIREMENT)
def test_one_retirement_kind_is_always_missing(
        machine_facts: MachineFacts, use_fake_nvml: Install, query: str) -> None:
    use_fake_nvml(fake_gpus([FakeGpu()], unsupported={query}))
    assert check_health(machine_facts("all"))[0].found == "healthy"  # type: ignore[index]


def test_several_faults_and_only_the_gpus_used(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(), FakeGpu(ecc_volatile=1, display_active=True)]))
    assert [c.status for c in check_health(machine_facts("0"))] == ["ok"]  # type: ignore[union-attr]
    bad = check_health(machine_facts("all"))[1]  # type: ignore[index]
    assert bad.status == "error" and "Display Active" in bad.found
    assert check_health(machine_facts("none")).status == "skip"  # type: ignore[union-attr]


def test_one_model_with_two_memory_sizes(
        machine_facts: MachineFacts, use_fake_nvml: Install) -> None:
    use_fake_nvml(fake_gpus([FakeGpu(memory_total=40 * 1024**3), FakeGpu()]))
    check = check_uniform(machine_facts("all"))
    assert check.status == "warn" and "GPU 0: 40960 MiB" in check.found
    assert "fit the smallest" in check.fix
