"""Why NVML failed here, decided from its return code and the machine's own facts.

Why NVML failed here: its return code (`nvmlerrors`) decided with the machine's own facts
(`nvidiahost`): the kernel module's version against the NVML library's, nouveau, the GPUs on
the PCI bus, /dev/nvidia* and their permissions, the user's groups, the container.

The same code has different causes on different machines (`NVML_ERROR_LIBRARY_NOT_FOUND`: a
CPU machine, a container started without the GPUs, a host with the kernel module but not its
libraries), and each cause its own fix: `nvml_failure` returns the one these facts point to.
"""

from __future__ import annotations

from dataclasses import dataclass

from mgpu_env.doctor.checks.common import nvml_fix
from mgpu_env.doctor.facts import Facts
from mgpu_env.hardware import nvmlerrors
from mgpu_env.hardware.nvidiahost import NvidiaHost, short_bus_id
from mgpu_env.hardware.nvml import FailedGpu, GpuListing

FIX_NOUVEAU = (
    "nouveau (the open-source driver) holds the GPUs, so the nvidia module cannot load: "
    "blacklist it (`printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' | sudo tee "
    "/etc/modprobe.d/blacklist-nouveau.conf && sudo update-initramfs -u`) and reboot"
)
FIX_MODULE_NOT_LOADED = (
    "load it: `sudo modprobe nvidia` says why it cannot: `Key was rejected by service` is "
    "Secure Boot (enrol the driver's key: `sudo mokutil --import /var/lib/dkms/mok.pub` and "
    "reboot, or turn Secure Boot off), `Module nvidia not found` a module not built for this "
    "kernel (`dkms status`; install `linux-headers-$(uname -r)` and reinstall the driver)"
)
FIX_CAPABILITIES = (
    "the container was given the GPUs without the driver's libraries: start it with "
    "NVIDIA_DRIVER_CAPABILITIES=compute,utility (or `all`); docker-compose.gpu.yml sets it"
)


@dataclass(frozen=True)
class Cause:
    """What the facts say NVML's failure means, and the fix for it."""

    cause: str
    fix: str


def gpus_on_machine(facts: Facts) -> tuple[str, ...]:
    """The NVIDIA GPUs the kernel shows (PCI bus, /proc/driver/nvidia), by bus id; the
    older count-only probe fills in where the bus ids are not known."""
    known = facts.host.nvidia.gpu_bus_ids
    if known:
        return known
    return tuple(f"GPU {i}" for i in range(facts.host.host_gpus.value or 0))


def _mismatch(host: NvidiaHost, in_container: bool) -> Cause | None:
    kernel, library = host.kernel_driver.value, host.nvml_library_version
    if not kernel or not library or kernel == library:
        return None
    cause = (f"the NVIDIA kernel module is {kernel}, but the libnvidia-ml.so this process "
             f"loaded is {library} ({host.nvml_library.value})")
    if in_container:
        return Cause(cause + ": the image ships driver libraries of its own",
                     f"remove the driver's libraries from the image ({host.nvml_library.value} "
                     "and its libnvidia-*/libcuda.so siblings, e.g. a libnvidia-compute-* or "
                     "nvidia-utils-* package): the NVIDIA Container Toolkit mounts the host's "
                     f"{kernel} ones")
    return Cause(cause + " (the driver was upgraded without a reboot)",
                 nvmlerrors.describe(18).fix)


def permission_cause(host: NvidiaHost) -> Cause | None:
    """The device files this user cannot open, with the group to join; None when none."""
    blocked = host.unusable_files
    if not blocked:
        return None
    files = ", ".join(f"/dev/{f.name} ({f.mode} group {f.group})" for f in blocked)
    groups = sorted({f.group for f in blocked})
    mine = ", ".join(host.groups.value or ()) or "unknown"
    return Cause(f"this user cannot open {files}; the user's groups: {mine}",
                 f"add the user to the group{'s' if len(groups) > 1 else ''} "
                 f"{', '.join(groups)} (`sudo usermod -aG {groups[0]} $USER`, then log in "
                 "again), or have udev give /dev/nvidia* mode 0666 (the driver's default, "
                 "`NVreg_DeviceFileMode`)")


def _no_driver(facts: Facts, gpus: tuple[str, ...]) -> Cause | None:
    """The kernel side: nouveau, or GPUs on the bus without the nvidia module."""
    host = facts.host.nvidia
    if "nouveau" in (host.modules.value or ()):
        return Cause("the nouveau module is loaded instead of nvidia", FIX_NOUVEAU)
    if gpus and host.modules.ok and host.modules.value is not None and not host.has_module:
        return Cause(f"{len(gpus)} NVIDIA GPU(s) on the PCI bus, but the nvidia kernel module "
                     "is not loaded", FIX_MODULE_NOT_LOADED)
    return None


def _library_missing(facts: Facts) -> Cause | None:
    host = facts.host
    kernel = host.nvidia.kernel_driver.value
    if host.in_container.value:
        files = host.device_files.value or ()
        capabilities = facts.environ.get("NVIDIA_DRIVER_CAPABILITIES")
        if files and capabilities is not None and not _has_capability(capabilities, "utility"):
            return Cause(f"the container has /dev/nvidia* but NVIDIA_DRIVER_CAPABILITIES="
                         f"{capabilities} leaves out NVML's library (utility)", FIX_CAPABILITIES)
        return None
    if kernel:
        major = kernel.split(".")[0]
        return Cause(f"the nvidia kernel module {kernel} is loaded, but not its "
                     "libnvidia-ml.so.1 (not installed, or not on the loader's path)",
                     f"install the driver's libraries of the same version {kernel} (Debian, "
                     f"Ubuntu: `sudo apt install nvidia-utils-{major} "
                     f"libnvidia-compute-{major}`); `ldconfig -p | grep libnvidia-ml` shows "
                     "what the loader knows")
    return None


def _has_capability(value: str, wanted: str) -> bool:
    words = {w.strip().lower() for w in value.split(",")}
    return "all" in words or wanted in words


def nvml_failure(facts: Facts) -> Cause:
    """The cause and fix of NVML's failure to start or list the GPUs (facts.nvml)."""
    listing = facts.nvml.listing
    code = listing.error_code
    host = facts.host.nvidia
    in_container = bool(facts.host.in_container.value)
    gpus = gpus_on_machine(facts)
    known = nvmlerrors.describe(code) if code is not None else None
    found = (_mismatch(host, in_container)
             or (permission_cause(host) if code in (4, 17, 999, None) else None)
             or (_no_driver(facts, gpus) if code in (9, 12, None) else None)
             or (_library_missing(facts) if code in (12, None) else None))
    if found is not None:
        return found
    if known is None or code in (9, 12):
        generic = known.cause if known else "NVML could not be used"
        if in_container and not (facts.host.device_files.value or ()):
            return Cause(generic + " (the container has no /dev/nvidia*)", nvml_fix(facts))
        return Cause(generic, nvml_fix(facts))
    return Cause(known.cause, known.fix)


def bus_id_of(failed: FailedGpu, listing: GpuListing, facts: Facts) -> str:
    """The failed GPU's bus id: NVML's when it answered that, else the PCI bus's in order
    (NVML numbers GPUs in PCI order) when the counts agree."""
    if failed.bus_id:
        return short_bus_id(failed.bus_id)
    on_bus = facts.host.nvidia.gpu_bus_ids
    if len(on_bus) == len(listing.gpus) + len(listing.failed):
        return on_bus[failed.index]
    return "bus id unknown"


def failed_devices(facts: Facts) -> tuple[str, str]:
    """(found, fix) for the GPUs NVML counts but cannot use."""
    listing = facts.nvml.listing
    lines, fixes = [], []
    for failed in listing.failed:
        entry = nvmlerrors.describe(failed.code) if failed.code is not None else None
        name = entry.name if entry else "error"
        lines.append(f"GPU {failed.index} ({bus_id_of(failed, listing, facts)}): {name}: "
                     f"{failed.error}" + (f"; {entry.cause}" if entry else ""))
        if entry and entry.fix not in fixes:
            fixes.append(entry.fix)
    healthy = ",".join(str(g.index) for g in listing.gpus)
    keep = (f"GPUS={healthy} trains on the healthy ones meanwhile" if healthy else
            "no GPU answers: GPUS=none trains on the CPU meanwhile")
    return "; ".join(lines), "; ".join([*fixes, keep])

