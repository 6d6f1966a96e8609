"""The host around the GPUs: what can break P2P between GPUs.

Docker's host side is `dockerhost`."""

from __future__ import annotations

from mgpu_env.doctor.checks.common import Check, CheckId, check, fewer_than_two_gpus
from mgpu_env.doctor.facts import Facts

# This module's check ids, each declared once (`CheckId`): its Checks are made by them.
HOST_P2P = CheckId("host.p2p")

FIX_P2P = (
    "if the all-reduce hangs or its sums are wrong, set NCCL_P2P_DISABLE=1 (NCCL then copies "
    "through host memory, slower but safe); for P2P at full speed turn the IOMMU to "
    "pass-through (`iommu=pt` on the kernel command line, or VT-d/AMD-Vi off in the BIOS) "
    "and ACS off on the PCIe bridges (BIOS, or `pci=noacs`); `mgpu doctor --smoke` tests "
    "the path"
)
FIX_P2P_VM = (
    "GPUs passed into a virtual machine rarely have working P2P: set NCCL_P2P_DISABLE=1 "
    "(NCCL then copies through host memory); `mgpu doctor --smoke` tests the path"
)


@check(220, HOST_P2P)
def check_p2p(facts: Facts) -> Check:
    """Whether the host can break the PCIe P2P path NVML reports between the GPUs."""
    title = "P2P path"
    expected = "no IOMMU translation, no ACS redirect, no hypervisor under PCIe P2P"
    host = facts.p2p
    if host is None or len(facts.selected) < 2:
        return HOST_P2P(title, "skip", f"{len(facts.selected)} GPU(s) used", expected,
                        skipped_for=fewer_than_two_gpus(facts))
    chosen = {g.index for g in facts.selected}
    pcie_p2p = [lk for lk in facts.nvml.links if lk.a in chosen and lk.b in chosen
                and lk.p2p_read.ok and lk.p2p_read.value
                and not (lk.nvlink.ok and lk.nvlink.value)]
    parts = [
        f"IOMMU groups: {host.iommu_groups.text()}",
        f"kernel: {host.cmdline.value or 'no IOMMU/ACS options'}" if host.cmdline.ok
        else f"kernel: {host.cmdline.text()}",
        "hypervisor: " + ("yes" if host.hypervisor.value else "no"
                          if host.hypervisor.ok else host.hypervisor.text()),
        "ACS redirect on: " + (", ".join(host.acs_bridges.value) or "no bridge"
                               if host.acs_bridges.ok and host.acs_bridges.value is not None
                               else host.acs_bridges.text()),
    ]
    found = "; ".join(parts)
    if not pcie_p2p:
        return HOST_P2P(title, "ok",
                        found + "; no PCIe P2P between the GPUs used (NVLink, or host memory)",
                        expected)
    pairs = ", ".join(f"{lk.a}-{lk.b}" for lk in pcie_p2p)
    if host.hypervisor.value:
        return HOST_P2P(title, "warn",
                        f"{found}; NVML reports PCIe P2P between {pairs} inside a virtual "
                        "machine", expected, FIX_P2P_VM)
    acs = host.acs_bridges.value if host.acs_bridges.ok else None
    if host.iommu_translates or acs:
        why = ("the IOMMU translates PCIe traffic" if host.iommu_translates else "") + (
            (" and " if host.iommu_translates else "") + "ACS redirects it" if acs else "")
        return HOST_P2P(title, "warn",
                        f"{found}; NVML reports PCIe P2P between {pairs}, but {why}: NCCL can "
                        "hang there (tensorflow#44976, NVIDIA/nccl#631)", expected, FIX_P2P)
    return HOST_P2P(title, "ok", found, expected)
