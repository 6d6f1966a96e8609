"""The first layers under a GPU: its PCI function and the kernel driver bound to it.

The first layers under a GPU: the PCI functions of NVIDIA's display and 3D class, the kernel
driver bound to each, and what the `nvidia` module says it attached.

- `/sys/bus/pci/devices/<bus id>/{vendor,class,device}` and the `driver` link: which driver
  holds each function (nvidia, nouveau, vfio-pci, pci-stub, none, anything else);
- `/proc/driver/nvidia/version`: the module's version and flavour ("Open Kernel Module" is the
  open one, which refuses GPUs before Turing);
- `/proc/driver/nvidia/gpus/<bus id>/information`: each GPU it attached and its device minor
  (the N of /dev/nvidiaN). In a container the toolkit covers the folders of GPUs it did not
  give with an empty tmpfs: a folder without `information` is a hidden GPU.

Everything is read under `hostroot` and returned as data; `driver_meaning` is the model of
what each bound driver means for CUDA, and its fix.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from mgpu_env.hardware.hostroot import host_root

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA-compatible, 3D controller (data-centre GPUs)
_VERSION = re.compile(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class PciGpu:
    """One NVIDIA display/3D PCI function and the kernel driver bound to it (None: none)."""

    bus_id: str  # sysfs form: 0000:3b:00.0
    device_id: str  # 0x2330
    driver: str | None


@dataclass(frozen=True)
class AttachedGpu:
    """A GPU under /proc/driver/nvidia/gpus: its minor, or hidden (a container's mask)."""

    bus_id: str
    minor: int | None
    hidden: bool = False


@dataclass(frozen=True)
class NvidiaModule:
    """The loaded nvidia module: version, flavour ("open" or "proprietary") and its GPUs."""

    version: str
    flavour: str
    gpus: tuple[AttachedGpu, ...]


@dataclass(frozen=True)
class DriverMeaning:
    """What a bound driver means for CUDA: `usable` only for nvidia."""

    kind: str  # nvidia, nouveau, passthrough, stub, none, other
    usable: bool
    cause: str
    fix: str


def short_bus_id(bus_id: str) -> str:
    """`00000000:3B:00.0` (NVML) and `0000:3b:00.0` (sysfs) as one form: `0000:3b:00.0`."""
    domain, _, rest = bus_id.strip().lower().rpartition(":")
    head, _, bus = domain.rpartition(":")
    return f"{int(head or '0', 16):04x}:{bus}:{rest}"


def _read(path: Path) -> str:
    return path.read_text().strip()


def pci_gpus(root: Path | None = None) -> tuple[PciGpu, ...]:
    """Every NVIDIA function of class 0x0300/0x0302 on the bus, in bus order. The audio
    function of a card (class 0x0403) is not a GPU."""
    folder = (host_root() if root is None else root) / "sys/bus/pci/devices"
    found = []
    for device in sorted(folder.iterdir()) if folder.is_dir() else ():
        try:
            vendor, kind = _read(device / "vendor"), _read(device / "class")
        except OSError:
            continue
        if vendor.lower() != NVIDIA_VENDOR or kind.lower()[:6] not in GPU_CLASSES:
            continue
        try:
            device_id = _read(device / "device")
        except OSError:
            device_id = "?"
        link = device / "driver"
        driver = os.path.basename(os.readlink(link)) if link.is_symlink() else None
        found.append(PciGpu(short_bus_id(device.name), device_id, driver))
    return tuple(found)


def _minor(information: str) -> int | None:
    match = re.search(r"^Device Minor:\s*(\d+)", information, re.M)
    return int(match.group(1)) if match else None


def nvidia_module(root: Path | None = None) -> NvidiaModule | None:
    """The module as /proc/driver/nvidia shows it; None when it is not loaded."""
    base = (host_root() if root is None else root) / "proc/driver/nvidia"
    version_file = base / "version"
    if not version_file.exists():
        return None
    text = version_file.read_text()
    match = _VERSION.search(text)
    if not match:
        raise ValueError(f"unreadable {version_file}: {text[:120]!r}")
    flavour = "open" if "Open Kernel Module" in text else "proprietary"
    gpus = []
    folder = base / "gpus"
    for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
        information = entry / "information"
        if information.is_file():
            gpus.append(AttachedGpu(short_bus_id(entry.name), _minor(information.read_text())))
        else:
            gpus.append(AttachedGpu(short_bus_id(entry.name), None, hidden=True))
    return NvidiaModule(match.group(1), flavour, tuple(gpus))


_PASSTHROUGH = ("vfio-pci", "vfio_pci")
_STUBS = ("pci-stub", "pci_stub", "pciback", "xen-pciback")


def driver_meaning(driver: str | None, gpu: PciGpu) -> DriverMeaning:
    """The model of the bound driver: every name falls in one kind, each with its fix."""
    ids = f"10de:{gpu.device_id.removeprefix('0x')}"
    rebind = ("`echo <bus id> | sudo tee /sys/bus/pci/devices/<bus id>/driver/unbind`, then "
              "`sudo modprobe nvidia`")
    if driver == "nvidia":
        return DriverMeaning("nvidia", True, "bound to nvidia", "")
    if driver is None:
        return DriverMeaning(
            "none", False,
            "no kernel driver is bound to it: the nvidia module is not loaded, or it refused "
            "this GPU",
            "`sudo modprobe nvidia`; if it stays unbound, `sudo dmesg | grep NVRM` says why "
            "(a GPU this driver branch does not support, the open flavour on a GPU before "
            "Turing, a GPU that fell off the bus); after a driver upgrade, reboot")
    if driver == "nouveau":
        return DriverMeaning(
            "nouveau", False,
            "the open-source nouveau driver holds it, which CUDA cannot use",
            "blacklist nouveau (`echo blacklist nouveau | sudo tee "
            "/etc/modprobe.d/blacklist-nouveau.conf && sudo update-initramfs -u`) and reboot")
    if driver in _PASSTHROUGH or driver.endswith(("vfio-pci", "vfio_pci")):
        return DriverMeaning(
            "passthrough", False,
            f"{driver} holds it: it is reserved for passing through to a virtual machine",
            f"if this machine should use it, remove {ids} from `vfio-pci.ids=` on the kernel "
            "command line and from `options vfio-pci ids=` in /etc/modprobe.d, or rebind it "
            f"now: {rebind}")
    if driver in _STUBS:
        return DriverMeaning(
            "stub", False,
            f"{driver} holds it: a placeholder that keeps every other driver off the GPU "
            "(set up for passthrough)",
            f"remove {ids} from `{driver.replace('_', '-')}.ids=` on the kernel command "
            f"line, or rebind it now: {rebind}")
    return DriverMeaning(
        "other", False, f"the kernel driver {driver!r} holds it, not NVIDIA's",
        f"unbind it and load nvidia: {rebind}")
