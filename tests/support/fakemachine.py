"""A machine's /proc, /sys and /dev as the NVIDIA driver lays them out, in a folder, for
`nvidiahost.collect(root)`: the GPUs on the PCI bus, the kernel module and its version, the
loaded modules, the device files with their modes, and the libnvidia-ml.so this process
mapped (a gcc-built library with the driver's soname, named by its version as the driver's
is)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tests.support.fakecuda import build_library

BUS_IDS = ("0000:18:00.0", "0000:3b:00.0", "0000:86:00.0", "0000:af:00.0")
DRIVER = "550.54.15"
_MODULE_LINE = "{name} 54001664 9 - Live 0x0000000000000000 (POE)"


def machine_root(
    root: Path, *, gpus: Iterable[str] = BUS_IDS[:2], kernel: str | None = DRIVER,
    modules: Iterable[str] = ("nvidia", "nvidia_modeset", "nvidia_uvm"),
    library: str | None = DRIVER, device_mode: int = 0o666, device_gid: int = 0,
    interfaces: Iterable[str] = ("eno1", "lo"),
) -> Path:
    """Lay out `root`. `kernel` None: no nvidia module answers in /proc/driver/nvidia;
    `library` None: no libnvidia-ml.so mapped."""
    gpus = tuple(gpus)
    devices = root / "sys/bus/pci/devices"
    bridge = devices / "0000:00:00.0"  # a host bridge, not a GPU
    bridge.mkdir(parents=True)
    (bridge / "vendor").write_text("0x8086\n")
    (bridge / "class").write_text("0x060000\n")
    for bus in gpus:
        (devices / bus).mkdir()
        (devices / bus / "vendor").write_text("0x10de\n")
        (devices / bus / "class").write_text("0x030200\n")
    proc = root / "proc"
    (proc / "self").mkdir(parents=True)
    if kernel is not None:
        (proc / "driver/nvidia/gpus").mkdir(parents=True)
        (proc / "driver/nvidia/version").write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {kernel}  Tue Mar  5 22:23:56 "
            "UTC 2024\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")
        for bus in gpus:
            (proc / "driver/nvidia/gpus" / bus).mkdir()
    (proc / "modules").write_text("".join(_MODULE_LINE.format(name=m) + "\n" for m in (
        "ext4", *modules)))
    (root / "etc").mkdir()
    (root / "etc/group").write_text("root:x:0:\nvideo:x:44:\nrender:x:105:\nuser:x:1000:\n")
    dev = root / "dev"
    dev.mkdir()
    names = ["nvidiactl", "nvidia-uvm", *(f"nvidia{i}" for i in range(len(gpus)))]
    for name in names if kernel is not None else ():
        (dev / name).write_text("")
        os.chmod(dev / name, device_mode)
        os.chown(dev / name, 0, device_gid)
    maps = ["55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 42 /usr/bin/python3.12"]
    if library is not None:
        folder = root / "usr/lib/x86_64-linux-gnu"
        built = build_library(folder, "libnvidia-ml.so.1")
        versioned = built.rename(folder / f"libnvidia-ml.so.{library}")
        (folder / "libnvidia-ml.so.1").symlink_to(versioned.name)
        maps.append(f"7f1c2a000000-7f1c2a100000 r-xp 00000000 08:01 43 {versioned}")
    (proc / "self/maps").write_text("\n".join(maps) + "\n")
    for name in interfaces:
        (root / "sys/class/net" / name).mkdir(parents=True)
    return root
