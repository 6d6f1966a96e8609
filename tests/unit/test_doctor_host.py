"""The host around the GPUs: IOMMU, ACS and a hypervisor under PCIe P2P; every probe against
a fake /sys or /proc. (Docker's host side: test_doctor_dockerhost.py.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mgpu_env.config.resolve import resolve_settings
from mgpu_env.doctor import Check, gather
from mgpu_env.doctor.checks import check_p2p
from mgpu_env.doctor.checks.host import FIX_P2P, FIX_P2P_VM
from mgpu_env.hardware import hostfacts
from tests.support.fake_nvml import FakeNvml
from tests.support.fakemachine import FakeHost, Machine, machine_nvml

Install = Callable[[FakeNvml], FakeNvml]
REAL_P2P = hostfacts.p2p_host


def config_space(control: int | None) -> bytes:
    """4096 bytes of PCI configuration with an ACS capability at 0x100 (None: without)."""
    data = bytearray(4096)
    if control is not None:
        data[0x100:0x104] = (0x000D | (1 << 16)).to_bytes(4, "little")
        data[0x106:0x108] = control.to_bytes(2, "little")
    return bytes(data)


def test_acs_control_is_read_from_the_extended_configuration() -> None:
    assert hostfacts.acs_redirecting(config_space(0x001D)) is True  # SrcValid ReqRedir ...
    assert hostfacts.acs_redirecting(config_space(0x0001)) is False  # SrcValid only
    assert hostfacts.acs_redirecting(config_space(None)) is False
    assert hostfacts.acs_redirecting(bytes(64)) is None  # not root: 64 bytes only


def fake_pci(tmp_path: Path, bridge_config: bytes) -> Path:
    root = tmp_path / "devices" / "pci0000:00"
    gpu = root / "0000:00:03.1" / "0000:41:00.0"
    gpu.mkdir(parents=True)
    (root / "0000:00:03.1" / "config").write_bytes(bridge_config)
    (gpu / "config").write_bytes(bytes(4096))
    bus = tmp_path / "bus"
    bus.mkdir()
    (bus / "0000:41:00.0").symlink_to(gpu)
    return bus


def test_acs_on_the_bridge_above_a_gpu(tmp_path: Path) -> None:
    bus = fake_pci(tmp_path, config_space(0x001D))
    found = hostfacts.acs_bridges(["00000000:41:00.0"], bus)
    assert found.value == ("0000:00:03.1",)


def test_acs_unreadable_without_root_is_could_not_collect(tmp_path: Path) -> None:
    bus = fake_pci(tmp_path, bytes(64))
    found = hostfacts.acs_bridges(["00000000:41:00.0"], bus)
    assert not found.ok and "root only" in (found.error or "")


def test_cmdline_hypervisor_and_groups(tmp_path: Path) -> None:
    (tmp_path / "cmdline").write_text("BOOT_IMAGE=/vmlinuz ro quiet intel_iommu=on iommu=pt\n")
    (tmp_path / "cpuinfo").write_text("processor: 0\nflags\t\t: fpu vme hypervisor avx\n")
    (tmp_path / "groups" / "0").mkdir(parents=True)
    (tmp_path / "groups" / "1").mkdir()
    assert hostfacts.kernel_cmdline(tmp_path / "cmdline").value == "intel_iommu=on iommu=pt"
    assert hostfacts.hypervisor(tmp_path / "cpuinfo").value is True
    assert hostfacts.iommu_groups(tmp_path / "groups").value == 2
    assert hostfacts.iommu_groups(tmp_path / "none").value == 0
    assert not hostfacts.kernel_cmdline(tmp_path / "missing").ok


def test_the_real_host_never_raises() -> None:
    host = REAL_P2P(("00000000:17:00.0", "bad"))
    for probed in (host.iommu_groups, host.cmdline, host.hypervisor, host.acs_bridges):
        assert probed.ok or probed.error


def p2p_check(fake_machine: Callable[..., FakeHost], machine: Machine,
              **nvml: Any) -> Check:
    host = fake_machine(machine, nvml=machine_nvml(machine, **nvml))
    return check_p2p(gather(resolve_settings({"GPUS": "all"}, host.environ), host.environ,
                            with_tensorflow=False))


@pytest.mark.parametrize(("machine", "status", "fix"), [
    (Machine(), "ok", ""),
    (Machine(iommu_groups=40, cmdline="ro intel_iommu=on"), "warn", FIX_P2P),
    (Machine(iommu_groups=40, cmdline="ro intel_iommu=on iommu=pt"), "ok", ""),
    (Machine(acs_bridge="0000:00:03.1"), "warn", FIX_P2P),
    (Machine(cpu_flags=("sse2", "avx", "hypervisor")), "warn", FIX_P2P_VM),
])
def test_p2p_verdict(fake_machine: Callable[..., FakeHost], machine: Machine, status: str,
                     fix: str) -> None:
    check = p2p_check(fake_machine, machine)
    assert (check.status, check.fix) == (status, fix), check
    if status == "warn":
        assert "NCCL_P2P_DISABLE=1" in check.fix


def test_nvlink_is_not_judged_by_the_pcie_path(fake_machine: Callable[..., FakeHost]) -> None:
    check = p2p_check(fake_machine, Machine(iommu_groups=9), nvlink=True)
    assert check.status == "ok"
