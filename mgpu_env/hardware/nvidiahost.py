"""The facts that tell NVML's failures apart, read from /proc, /sys and /dev (no NVML, no root).

- the kernel module's driver version (`/proc/driver/nvidia/version`), against the version of
  the `libnvidia-ml.so` this process mapped (`/proc/self/maps`; the driver's files are named
  `libnvidia-ml.so.<driver version>`): a Driver/library version mismatch names both;
- the loaded modules (`/proc/modules`: nvidia, nvidia_uvm, ... and nouveau, which holds the GPU
  so that nvidia cannot load);
- the NVIDIA GPUs on the PCI bus (`/sys/bus/pci/devices/*`, vendor 0x10de, class 0x03xx) and
  in the driver's `/proc/driver/nvidia/gpus/<bus id>`: a machine with GPUs that NVML cannot
  use is not a CPU machine;
- the device files `/dev/nvidia*`, their mode and group, and whether this user can open them,
  with the user's groups.

`collect(root)` reads everything under `root` (tests give it a fake tree laid out as a real
machine shows it) and never raises: what it cannot read is "could not collect (why)".
"""

from __future__ import annotations

import dataclasses
import grp
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from mgpu_env.hardware import devopen, pcibus
from mgpu_env.hardware.hostroot import host_root
from mgpu_env.hardware.nvml import Probed, probe

NVIDIA_PCI_VENDOR = "0x10de"
DISPLAY_CLASS_PREFIX = "0x03"  # VGA (0x0300) and 3D controllers (0x0302: data-centre GPUs)
_KERNEL_VERSION = re.compile(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)")
_LIBRARY_VERSION = re.compile(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")
MODULES_OF_INTEREST = ("nvidia", "nouveau")


@dataclass(frozen=True)
class DeviceFile:
    """One /dev/nvidia* file: its mode, owning group, and whether this user can open it."""

    name: str
    mode: str  # as ls shows it: crw-rw-rw-
    group: str
    usable: bool  # read and write for this user


@dataclass(frozen=True)
class NvidiaHost:
    """What /proc, /sys and /dev say about the NVIDIA driver and GPUs. A default-built one
    knows nothing (every field unset), as in reports made before it existed."""

    kernel_driver: Probed[str | None] = field(default_factory=Probed)  # None: no module
    modules: Probed[tuple[str, ...]] = field(default_factory=Probed)
    pci_gpus: Probed[tuple[str, ...]] = field(default_factory=Probed)  # bus ids
    proc_gpus: Probed[tuple[str, ...]] = field(default_factory=Probed)  # bus ids
    device_files: Probed[tuple[DeviceFile, ...]] = field(default_factory=Probed)
    groups: Probed[tuple[str, ...]] = field(default_factory=Probed)
    nvml_library: Probed[str | None] = field(default_factory=Probed)  # None: none mapped
    # The chain's lower layers (`doctor.chain`): each PCI function and its bound driver, the
    # module's flavour and the GPUs it attached (minors), the device files opened for real,
    # who opened them, and cgroup v1's device rules. A value of None: not read.
    pci: Probed[tuple[pcibus.PciGpu, ...]] = field(default_factory=Probed)
    module: Probed[pcibus.NvidiaModule | None] = field(default_factory=Probed)
    opens: Probed[tuple[devopen.DeviceOpen, ...]] = field(default_factory=Probed)
    identity: Probed[devopen.Identity] = field(default_factory=Probed)
    device_rules: Probed[tuple[str, ...] | None] = field(default_factory=Probed)

    @property
    def gpu_bus_ids(self) -> tuple[str, ...]:
        """The NVIDIA GPUs the kernel knows, by bus id (PCI order, which is NVML's)."""
        ids = {_short(b) for b in (self.pci_gpus.value or ()) + (self.proc_gpus.value or ())}
        return tuple(sorted(ids))

    @property
    def nvml_library_version(self) -> str | None:
        match = _LIBRARY_VERSION.search(os.path.basename(self.nvml_library.value or ""))
        return match.group(1) if match else None

    @property
    def has_module(self) -> bool:
        return "nvidia" in (self.modules.value or ())

    @property
    def unusable_files(self) -> tuple[DeviceFile, ...]:
        return tuple(f for f in self.device_files.value or () if not f.usable)


def _short(bus_id: str) -> str:
    """`00000000:3B:00.0` (NVML) and `0000:3b:00.0` (sysfs) as one form: `0000:3b:00.0`."""
    domain, _, rest = bus_id.strip().lower().rpartition(":")
    head, _, bus = domain.rpartition(":")
    return f"{int(head or '0', 16):04x}:{bus}:{rest}"


def short_bus_id(bus_id: str) -> str:
    """A bus id in sysfs's form, whichever form it came in."""
    return _short(bus_id)


def kernel_driver(root: Path) -> str | None:
    """The loaded kernel module's version; None when /proc/driver/nvidia/version is absent."""
    path = root / "proc/driver/nvidia/version"
    if not path.exists():
        return None
    match = _KERNEL_VERSION.search(path.read_text())
    if not match:
        raise ValueError(f"unreadable {path}")
    return match.group(1)


def modules(root: Path) -> tuple[str, ...]:
    lines = (root / "proc/modules").read_text().splitlines()
    return tuple(sorted(name for name in (line.split()[0] for line in lines if line.strip())
                        if name.startswith(MODULES_OF_INTEREST)))


def pci_gpus(root: Path) -> tuple[str, ...]:
    found = []
    folder = root / "sys/bus/pci/devices"
    for device in sorted(folder.iterdir()) if folder.is_dir() else ():
        try:
            vendor = (device / "vendor").read_text().strip()
            kind = (device / "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA_PCI_VENDOR and kind.startswith(DISPLAY_CLASS_PREFIX):
            found.append(device.name)
    return tuple(found)


def proc_gpus(root: Path) -> tuple[str, ...]:
    folder = root / "proc/driver/nvidia/gpus"
    return tuple(sorted(p.name for p in folder.iterdir())) if folder.is_dir() else ()


def _group_name(gid: int, root: Path | None = None) -> str:
    """The group's name as this machine (or container) names it: its /etc/group, else the
    system's lookup (NSS), else the number."""
    root = host_root() if root is None else root
    try:
        for line in (root / "etc/group").read_text().splitlines():
            parts = line.split(":")
            if len(parts) >= 3 and parts[2] == str(gid):
                return parts[0]
    except OSError:
        pass
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _can_open(info: os.stat_result, uid: int, gids: tuple[int, ...]) -> bool:
    """Read-write by the mode bits, as the kernel decides it for `uid` in `gids` (root
    passes; a cgroup that denies the device is NVML's OPERATING_SYSTEM/UNKNOWN instead)."""
    if uid == 0:
        return True
    if info.st_uid == uid:
        wanted = stat.S_IRUSR | stat.S_IWUSR
    elif info.st_gid in gids:
        wanted = stat.S_IRGRP | stat.S_IWGRP
    else:
        wanted = stat.S_IROTH | stat.S_IWOTH
    return info.st_mode & wanted == wanted


def device_files(root: Path, uid: int, gids: tuple[int, ...]) -> tuple[DeviceFile, ...]:
    files = []
    for path in sorted((root / "dev").glob("nvidia*")):
        if path.is_dir():  # /dev/nvidia-caps
            continue
        info = path.stat()
        files.append(DeviceFile(path.name, stat.filemode(info.st_mode),
                                _group_name(info.st_gid, root), _can_open(info, uid, gids)))
    return tuple(files)


def groups(gids: tuple[int, ...], root: Path | None = None) -> tuple[str, ...]:
    return tuple(sorted({_group_name(g, root) for g in gids}))


def nvml_library(root: Path) -> str | None:
    """The libnvidia-ml.so file this process mapped (nvidia-ml-py loads it at nvmlInit),
    resolved to its versioned name; None when none is mapped."""
    for line in (root / "proc/self/maps").read_text().splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and os.path.basename(parts[5]).startswith("libnvidia-ml.so"):
            return os.path.realpath(parts[5].strip())
    return None


def collect(
    root: Path | None = None, uid: int | None = None, gids: tuple[int, ...] | None = None,
) -> NvidiaHost:
    """Every fact, each on its own (one unreadable file leaves the others). Read after NVML
    was asked, so that its library is mapped. `uid`, `gids`: the user judged (default:
    this process's)."""
    root = host_root() if root is None else root
    who = devopen.identity(root)
    if uid is not None or gids is not None:
        who = devopen.Identity(who.uid if uid is None else uid, who.gid,
                               who.groups if gids is None else gids)
    uid, gids = who.uid, tuple({*who.groups, who.gid})
    module = probe(lambda: pcibus.nvidia_module(root))
    return NvidiaHost(
        pci=probe(lambda: pcibus.pci_gpus(root)),
        module=module,
        opens=probe(lambda: _opens(root, module.value, who)),
        identity=Probed(value=who),
        device_rules=probe(lambda: devopen.device_rules(root)),
        kernel_driver=probe(lambda: kernel_driver(root)),
        modules=probe(lambda: modules(root)),
        pci_gpus=probe(lambda: pci_gpus(root)),
        proc_gpus=probe(lambda: proc_gpus(root)),
        device_files=probe(lambda: device_files(root, uid, gids)),
        groups=probe(lambda: groups(gids, root)),
        nvml_library=probe(lambda: nvml_library(root)),
    )


def _opens(root: Path, module: pcibus.NvidiaModule | None,
           who: devopen.Identity) -> tuple[devopen.DeviceOpen, ...]:
    """Open the files CUDA opens: nvidiactl, nvidia-uvm, and each attached GPU's minor (or,
    without the module's list, every /dev/nvidia<N> there is)."""
    minors = sorted({g.minor for g in (module.gpus if module else ()) if g.minor is not None})
    if module is None:
        minors = sorted(int(p.name[6:]) for p in (root / "dev").glob("nvidia[0-9]*")
                        if p.name[6:].isdigit())
    names = ["nvidiactl", "nvidia-uvm", *(f"nvidia{m}" for m in minors)]
    opened = (devopen.open_device(name, who, root) for name in names)
    return tuple(dataclasses.replace(o, group=_group_name(o.gid, root)) if o.gid is not None
                 else o for o in opened)
