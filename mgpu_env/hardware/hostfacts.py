"""Facts of the host that stand between GPUs for peer-to-peer copies.

Facts of the host around the GPUs that neither NVML nor CUDA report: what stands between GPUs
for peer-to-peer copies. (Docker's host side is `dockerhost`.)

- P2P (`p2p_host`): IOMMU groups (/sys/kernel/iommu_groups), the kernel command line
  (iommu=, intel_iommu=, amd_iommu=, pci=noacs), ACS enabled on the PCI bridges above the GPUs
  (/sys/bus/pci/devices/*/config: extended configuration space, readable by root only), and
  a hypervisor (/proc/cpuinfo's `hypervisor` flag). With the IOMMU translating, ACS
  redirecting, or GPUs passed into a VM, NVLink-less P2P can hang NCCL while NVML reports it
  supported (tensorflow#44976, NVIDIA/nccl#631, #2079).

Every probe is a small function with paths as arguments (tests give them a fake /sys), never
raises, and needs no root: what it cannot read is "could not collect (why)".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mgpu_env.hardware.hostroot import host_path
from mgpu_env.hardware.nvml import Probed, probe

# ------------------------------------------------------------------------------- P2P


@dataclass(frozen=True)
class P2pHost:
    """What the host says about peer-to-peer traffic between GPUs."""

    iommu_groups: Probed[int] = field(default_factory=Probed)  # 0: no IOMMU translating
    cmdline: Probed[str] = field(default_factory=Probed)  # the IOMMU/ACS words of it
    hypervisor: Probed[bool] = field(default_factory=Probed)
    # PCI bridges above the GPUs with ACS redirecting peer traffic (ReqRedir/CmpltRedir).
    acs_bridges: Probed[tuple[str, ...]] = field(default_factory=Probed)

    @property
    def iommu_translates(self) -> bool:
        """IOMMU groups exist and the command line does not put it in pass-through."""
        words = (self.cmdline.value or "").split()
        passthrough = any(w in ("iommu=pt", "iommu=off", "intel_iommu=off", "amd_iommu=off")
                          for w in words)
        return bool(self.iommu_groups.value) and not passthrough


IOMMU_WORDS = ("iommu", "intel_iommu", "amd_iommu", "pci", "vfio")


def iommu_groups(root: Path | None = None) -> Probed[int]:
    def count() -> int:
        folder = root or host_path("/sys/kernel/iommu_groups")
        return len(list(folder.iterdir())) if folder.is_dir() else 0

    return probe(count)


def kernel_cmdline(path: Path | None = None) -> Probed[str]:
    return probe(lambda: " ".join(
        w for w in (path or host_path("/proc/cmdline")).read_text().split()
        if w.split("=")[0].split(".")[0] in IOMMU_WORDS))


def hypervisor(cpuinfo: Path | None = None) -> Probed[bool]:
    def flag() -> bool:
        for line in (cpuinfo or host_path("/proc/cpuinfo")).read_text().splitlines():
            if line.startswith("flags"):
                return "hypervisor" in line.split(":", 1)[1].split()
        return False

    return probe(flag)


_ACS_ID = 0x000D
_REQ_REDIR, _CMPLT_REDIR = 0x04, 0x08


def acs_redirecting(config: bytes) -> bool | None:
    """Whether a PCI function's ACS control redirects requests or completions upstream;
    None when its extended configuration space cannot be read (not root)."""
    if len(config) <= 256:
        return None
    offset = 0x100
    seen = set()
    while offset and offset not in seen and offset + 8 <= len(config):
        seen.add(offset)
        header = int.from_bytes(config[offset:offset + 4], "little")
        if header & 0xFFFF == _ACS_ID:
            control = int.from_bytes(config[offset + 6:offset + 8], "little")
            return bool(control & (_REQ_REDIR | _CMPLT_REDIR))
        offset = (header >> 20) & 0xFFC
    return False


def bridges_above(bus_id: str, devices: Path | None = None) -> list[Path]:
    """The PCI bridges between the root complex and the GPU at `bus_id` (nearest last)."""
    devices = devices or host_path("/sys/bus/pci/devices")
    address = bus_id.lower()
    if address.count(":") == 2 and len(address.split(":")[0]) == 8:
        address = address[4:]  # NVML's 00000000:17:00.0 -> sysfs 0000:17:00.0
    real = (devices / address).resolve()
    return [p for p in real.parents if p.name.count(":") == 2 and "." in p.name]


def acs_bridges(bus_ids: Iterable[str],
                devices: Path | None = None) -> Probed[tuple[str, ...]]:
    def collect() -> tuple[str, ...]:
        found: list[str] = []
        unreadable = False
        for bus_id in bus_ids:
            for bridge in bridges_above(bus_id, devices):
                try:
                    redirecting = acs_redirecting((bridge / "config").read_bytes())
                except OSError:
                    redirecting = None
                if redirecting is None:
                    unreadable = True
                elif redirecting and bridge.name not in found:
                    found.append(bridge.name)
        if unreadable and not found:
            raise PermissionError("the bridges' extended PCI configuration is readable by "
                                  "root only (`sudo lspci -vvv | grep ACSCtl` shows it)")
        return tuple(found)

    return probe(collect)


def p2p_host(bus_ids: Iterable[str]) -> P2pHost:
    return P2pHost(iommu_groups(), kernel_cmdline(), hypervisor(), acs_bridges(bus_ids))
