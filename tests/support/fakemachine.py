"""A machine as files: /proc, /sys, /dev, /etc and the process's identity and limits, laid
out in a folder as Linux and the NVIDIA driver lay them out, for every probe that reads under
`hostroot` (MGPU_HOST_ROOT). With the fake NVML (`machine_nvml`), the gcc-built libraries
(`tests.support.fakecuda`) and the stand-in TensorFlow, it is the whole machine below the
doctor; no function of the doctor is replaced.

Device files: character devices made with mknod where this process may (root): a healthy
GPU's is `c 1 3` (the null device: it opens, as a working /dev/nvidia<N> does), a GPU whose
module is gone keeps NVIDIA's own number `c 195 <minor>` (no driver behind it: the open
fails with ENXIO, for real). Where mknod is not allowed (not root, or a user namespace),
regular files with the same mode stand in and `dead` files cannot be made: the tests that
need them skip, saying so. A mode the identity in /proc/self/status may not open is judged
as the kernel would (`hardware.devopen`), since a test running as root passes every mode.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mgpu_env.doctor import facts as probes
from mgpu_env.hardware import cudadriver
from tests.support.fake_nvml import FakeGpu, FakeNvml
from tests.support.fakecuda import build_libcuda, build_library
from tests.support.fakelimits import lay_out as lay_out_limits

# CUDA's driver probe as it runs (a child loading libcuda.so.1), taken before the suite's
# autouse fixture replaces it with a canned answer.
REAL_DRIVER_COLLECT = cudadriver.collect
REAL_PROBE_P2P = probes.probe_p2p  # the host's P2P facts, read under MGPU_HOST_ROOT

BUS_IDS = ("0000:18:00.0", "0000:3b:00.0", "0000:86:00.0", "0000:af:00.0")
DRIVER = "550.54.15"  # the catalogue's machines
HEALTHY_DRIVER = "555.42.06"  # runs CUDA 12.5 (TensorFlow 2.21's build) without compat
_MODULE_LINE = "{name} 54001664 9 - Live 0x0000000000000000 (POE)"
CPU_FLAGS = ("fpu", "sse", "sse2", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma",
             "avx512f", "avx512_bf16")


def bus_ids(count: int) -> tuple[str, ...]:
    """`count` bus ids as the fake NVML numbers its GPUs (00000000:10:00.0, ...)."""
    return tuple(f"0000:{0x10 + i:02x}:00.0" for i in range(count))


def mknod_allowed(folder: Path) -> bool:
    """Whether this process may make character devices here (root outside a user ns)."""
    probe = folder / ".mknod-probe"
    try:
        os.mknod(probe, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        return False
    probe.unlink()
    return True


@dataclass
class Machine:
    """What to lay out. `drivers`: bus id -> bound driver (None: none), default nvidia;
    `hidden`: bus ids whose /proc/driver/nvidia/gpus folder a container runtime emptied;
    `devices`: "char" (mknod, else files), "file"; `dead`: minors whose file has no driver
    behind it; `missing`/`folders`: device names absent, or folders (a bad bind mount)."""

    gpus: tuple[str, ...] = BUS_IDS[:2]
    device_class: str = "0x030200"
    drivers: Mapping[str, str | None] = field(default_factory=dict)
    kernel: str | None = HEALTHY_DRIVER
    flavour: str = "proprietary"
    attached: tuple[str, ...] | None = None  # None: every GPU bound to nvidia
    hidden: tuple[str, ...] = ()
    modules: tuple[str, ...] = ("nvidia", "nvidia_modeset", "nvidia_uvm")
    library: str | None = HEALTHY_DRIVER
    devices: str = "char"
    device_mode: int = 0o666
    device_gid: int = 0
    dead: tuple[int, ...] = ()
    missing: tuple[str, ...] = ()
    folders: tuple[str, ...] = ()
    uid: int = 1000
    gid: int = 1000
    groups: tuple[int, ...] = (1000, 44)
    cpu_flags: tuple[str, ...] = tuple(CPU_FLAGS)
    container: bool = False
    device_rules: tuple[str, ...] | None = None  # cgroup v1 devices.list
    oom_kills: int = 0
    interfaces: tuple[str, ...] = ("eno1", "lo")
    iommu_groups: int = 0
    cmdline: str = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet"
    acs_bridge: str | None = None  # a PCIe switch port above every GPU, ACS redirecting
    processes: Mapping[int, str] = field(default_factory=dict)  # pid -> name, in /proc

    @property
    def usable(self) -> tuple[str, ...]:
        """The GPUs NVML lists here: bound, attached, shown, their files opening."""
        attached = self.attached if self.attached is not None else self.gpus
        return tuple(b for n, b in enumerate(self.gpus)
                     if self.drivers.get(b, "nvidia") == "nvidia" and b in attached
                     and b not in self.hidden and n not in self.dead
                     and f"nvidia{n}" not in (*self.missing, *self.folders))


@dataclass(frozen=True)
class FakeHost:
    """A laid-out machine: its root and the environment its children need (the folder of
    its libcuda.so.1 on LD_LIBRARY_PATH)."""

    root: Path
    environ: dict[str, str]


def machine_nvml(machine: Machine, **changes: Any) -> FakeNvml:
    """NVML as this machine answers: its usable GPUs, by their bus ids, the module's
    driver version."""
    gpus = [FakeGpu(name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0),
                    bus_id="0000" + bus.upper()) for bus in machine.usable]
    return FakeNvml(gpus=gpus, **{"driver_version": machine.kernel or HEALTHY_DRIVER,
                                  "cuda_driver_version": 12050, **changes})


_BUILT: dict[str, Path] = {}


def _built(key: str, folder: Path, name: str, make: Callable[[Path], Path]) -> Path:
    """`make(folder)` once per process for `key` (gcc takes a fraction of a second each
    time); a copy of that library at folder/name afterwards."""
    if key not in _BUILT:
        scratch = tempfile.mkdtemp(prefix="mgpu-fake-lib-")
        atexit.register(shutil.rmtree, scratch, True)
        _BUILT[key] = make(Path(scratch))
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(_BUILT[key], folder / name))


def build_libcuda_versioned(folder: Path, version: str | None, **options: int) -> Path:
    """A gcc-built libcuda.so.1 named as the driver installs it: libcuda.so.<version>, with
    the soname link (None: only libcuda.so.1)."""
    key = "libcuda " + " ".join(f"{k}={v}" for k, v in sorted(options.items()))
    built = _built(key, folder, "libcuda.so.1", lambda f: build_libcuda(f, **options))
    if version is None:
        return built
    versioned = built.rename(folder / f"libcuda.so.{version}")
    built.symlink_to(versioned.name)
    return versioned


def _pci(root: Path, m: Machine) -> None:
    devices = root / "sys/bus/pci/devices"
    drivers = root / "sys/bus/pci/drivers"
    bridge = devices / "0000:00:00.0"  # a host bridge, not a GPU
    bridge.mkdir(parents=True)
    (bridge / "vendor").write_text("0x8086\n")
    (bridge / "class").write_text("0x060000\n")
    for bus in m.gpus:
        if m.acs_bridge is not None:
            # sysfs's devices are links into the PCI tree: the bridge above holds the GPU.
            real = root / "sys/devices/pci0000:00" / m.acs_bridge / bus
            real.mkdir(parents=True)
            (devices / bus).symlink_to(real)
            (real.parent / "config").write_bytes(_acs_config())
        else:
            (devices / bus).mkdir()
        (devices / bus / "vendor").write_text("0x10de\n")
        (devices / bus / "class").write_text(m.device_class + "\n")
        (devices / bus / "device").write_text("0x2330\n")
        (devices / bus / "numa_node").write_text("-1\n")
        driver = m.drivers.get(bus, "nvidia")
        if driver is not None:
            (drivers / driver).mkdir(parents=True, exist_ok=True)
            (devices / bus / "driver").symlink_to(drivers / driver)
        audio = devices / (bus[:-1] + "1")  # the card's HDMI audio: class 0x0403, no GPU
        audio.mkdir()
        (audio / "vendor").write_text("0x10de\n")
        (audio / "class").write_text("0x040300\n")


def _acs_config() -> bytes:
    """A bridge's 4 KiB configuration space whose ACS capability (0x000D at 0x100, the last
    extended capability) redirects requests and completions upstream."""
    config = bytearray(4096)
    config[0x100:0x104] = (0x000D | (1 << 16)).to_bytes(4, "little")
    config[0x106:0x108] = (0x04 | 0x08).to_bytes(2, "little")
    return bytes(config)


def _proc_driver(root: Path, m: Machine) -> None:
    base = root / "proc/driver/nvidia"
    kind = "Open Kernel Module for x86_64" if m.flavour == "open" else "x86_64 Kernel Module"
    (base / "gpus").mkdir(parents=True)
    (base / "version").write_text(
        f"NVRM version: NVIDIA UNIX {kind}  {m.kernel}  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")
    attached = m.attached if m.attached is not None else tuple(
        b for b in m.gpus if m.drivers.get(b, "nvidia") == "nvidia")
    for minor, bus in enumerate(m.gpus):
        if bus not in attached:
            continue
        folder = base / "gpus" / bus
        folder.mkdir()
        if bus not in m.hidden:
            (folder / "information").write_text(
                f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 150\nBus Location: \t {bus}\n"
                f"Device Minor: \t {minor}\nGPU Excluded:\t No\n")


def _device(path: Path, m: Machine, dead: bool, char: bool) -> None:
    if char:
        number = os.makedev(195, int(path.name[6:])) if dead else os.makedev(1, 3)
        os.mknod(path, m.device_mode | stat.S_IFCHR, number)
    else:
        path.write_text("")
    os.chmod(path, m.device_mode)
    os.chown(path, 0, m.device_gid)


def _dev(root: Path, m: Machine) -> None:
    dev = root / "dev"
    (dev / "shm").mkdir(parents=True, exist_ok=True)
    char = m.devices == "char" and mknod_allowed(dev)
    names = ["nvidiactl", "nvidia-uvm", *(f"nvidia{i}" for i in range(len(m.gpus)))]
    for name in names if m.kernel is not None else ():
        if name in m.missing:
            continue
        if name in m.folders:
            (dev / name).mkdir()
            continue
        dead = name[6:].isdigit() and int(name[6:]) in m.dead
        if dead and not char:
            raise OSError("a device file with no driver behind it needs mknod (root)")
        _device(dev / name, m, dead, char)


def _process(root: Path, m: Machine) -> None:
    proc = root / "proc"
    (proc / "self").mkdir(parents=True, exist_ok=True)
    groups = " ".join(str(g) for g in m.groups)
    # The limits of a healthy machine first (rlimits, the kernel's, /dev/shm, the CPUs
    # allowed), then this machine's identity over the status they wrote.
    lay_out_limits(root, uid=m.uid)
    (proc / "self/status").write_text(
        f"Name:\tpython3\nUmask:\t0022\nState:\tR (running)\nUid:\t{m.uid}\t{m.uid}\t{m.uid}\t"
        f"{m.uid}\nGid:\t{m.gid}\t{m.gid}\t{m.gid}\t{m.gid}\nGroups:\t{groups}\n"
        "Threads:\t4\nCpus_allowed_list:\t0-7\nCapEff:\t0000000000000000\n")
    (proc / "cpuinfo").write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum "
        f"8480+\nflags\t\t: {' '.join(m.cpu_flags)}\n\n")
    (proc / "meminfo").write_text("MemTotal:       2113459200 kB\n"
                                  "MemAvailable:   2013459200 kB\n")
    (proc / "cmdline").write_text(m.cmdline + "\n")
    (proc / "modules").write_text("".join(_MODULE_LINE.format(name=n) + "\n" for n in (
        "ext4", *m.modules)))
    cgroup = "0::/docker/0123abcd\n" if m.container else "0::/user.slice\n"
    (proc / "1").mkdir(exist_ok=True)
    (proc / "1/cgroup").write_text(cgroup)
    (proc / "self/cgroup").write_text("11:devices:/job\n" + cgroup)
    for pid, name in m.processes.items():
        (proc / str(pid)).mkdir(exist_ok=True)
        (proc / str(pid) / "comm").write_text(name + "\n")
    if m.container:
        (root / ".dockerenv").write_text("")


def _etc_and_sys(root: Path, m: Machine) -> None:
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/group").write_text("root:x:0:\nvideo:x:44:\nrender:x:105:\nuser:x:1000:\n")
    (root / "etc/os-release").write_text('PRETTY_NAME="Ubuntu 24.04 LTS"\nNAME="Ubuntu"\n')
    cgroup = root / "sys/fs/cgroup"
    cgroup.mkdir(parents=True, exist_ok=True)
    (cgroup / "memory.events").write_text(f"low 0\nhigh 0\nmax 0\noom 0\noom_kill {m.oom_kills}\n")
    if m.device_rules is not None:
        (cgroup / "devices/job").mkdir(parents=True)
        (cgroup / "devices/job/devices.list").write_text("\n".join(m.device_rules) + "\n")
    for group in range(m.iommu_groups):
        (root / "sys/kernel/iommu_groups" / str(group)).mkdir(parents=True)
    (root / "sys/kernel/iommu_groups").mkdir(parents=True, exist_ok=True)
    for name in m.interfaces:
        (root / "sys/class/net" / name).mkdir(parents=True)


def _maps(root: Path, m: Machine) -> None:
    maps = ["55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 42 /usr/bin/python3.12"]
    if m.library is not None:
        folder = root / "usr/lib/x86_64-linux-gnu"
        built = _built("libnvidia-ml", folder, "libnvidia-ml.so.1",
                       lambda f: build_library(f, "libnvidia-ml.so.1"))
        versioned = built.rename(folder / f"libnvidia-ml.so.{m.library}")
        (folder / "libnvidia-ml.so.1").symlink_to(versioned.name)
        maps.append(f"7f1c2a000000-7f1c2a100000 r-xp 00000000 08:01 43 {versioned}")
    (root / "proc/self/maps").write_text("\n".join(maps) + "\n")


def build(root: Path, machine: Machine) -> Path:
    """Lay out `machine` under `root` (created)."""
    root.mkdir(parents=True, exist_ok=True)
    _pci(root, machine)
    if machine.kernel is not None:
        _proc_driver(root, machine)
    _process(root, machine)
    _dev(root, machine)
    _etc_and_sys(root, machine)
    _maps(root, machine)
    return root


def machine_root(
    root: Path, *, gpus: Iterable[str] = BUS_IDS[:2], kernel: str | None = DRIVER,
    modules: Iterable[str] = ("nvidia", "nvidia_modeset", "nvidia_uvm"),
    library: str | None = DRIVER, device_mode: int = 0o666, device_gid: int = 0,
    interfaces: Iterable[str] = ("eno1", "lo"),
) -> Path:
    """The catalogue's layout (its keyword names): `kernel` None: no nvidia module answers
    in /proc/driver/nvidia; `library` None: no libnvidia-ml.so mapped."""
    gpus = tuple(gpus)
    return build(root, Machine(
        gpus=gpus, kernel=kernel, modules=tuple(modules), library=library,
        device_mode=device_mode, device_gid=device_gid, interfaces=tuple(interfaces),
        drivers={} if kernel is not None else dict.fromkeys(gpus),
        devices="file", groups=(1000,)))
