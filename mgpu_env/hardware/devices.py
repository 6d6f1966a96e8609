"""Choosing GPUs (before TensorFlow starts) and splitting devices into logical ones.

CUDA reads `CUDA_VISIBLE_DEVICES` once, when TensorFlow first touches the GPU, so the
selection must be written to the environment before TensorFlow is imported. With
`CUDA_DEVICE_ORDER=PCI_BUS_ID`, index 1 is the same card in nvidia-smi, in `mgpu doctor`
and in training (CUDA's default order is "fastest first").
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from mgpu_env.config.settings import GpuRequest, SettingError
from mgpu_env.hardware.nvml import GpuInfo, GpuListing

# CUDA hides every GPU for an id that matches none; "-1" is the documented idiom.
HIDE_ALL_GPUS = "-1"


@dataclass(frozen=True)
class GpuSelection:
    """The GPUs a run will use, and the CUDA_VISIBLE_DEVICES value that exposes them."""

    request: GpuRequest
    gpus: tuple[GpuInfo, ...]
    cuda_visible_devices: str | None  # None: leave the variable as the user set it
    note: str | None = None

    @property
    def uses_cpu(self) -> bool:
        return not self.gpus


def _gpus_text(listing: GpuListing) -> str:
    if not listing.available:
        return f"NVML reports no GPUs ({listing.error})"
    if not listing.gpus:
        return "NVML reports no GPUs"
    return f"NVML reports {len(listing.gpus)} GPU(s), indices 0..{len(listing.gpus) - 1}"


def visible_gpus(cuda_visible_devices: str, gpus: Sequence[GpuInfo]) -> tuple[GpuInfo, ...]:
    """The GPUs a CUDA_VISIBLE_DEVICES value exposes, in its order (indices or UUID prefixes).

    CUDA stops at the first id that matches no device, so "-1" or "" hides every GPU.
    """
    visible: list[GpuInfo] = []
    for item in (i.strip() for i in cuda_visible_devices.split(",")):
        if item.isdigit() and int(item) < len(gpus):
            visible.append(gpus[int(item)])
            continue
        matches = [g for g in gpus if item and g.uuid.lower().startswith(item.lower())]
        if len(matches) != 1:
            break
        visible.append(matches[0])
    return tuple(visible)


def select_gpus(
    request: GpuRequest, listing: GpuListing, environ: MutableMapping[str, str] | None = None
) -> GpuSelection:
    """Check `GPUS` against the GPUs NVML reports. Raises SettingError for a bad request."""
    environ = os.environ if environ is None else environ
    gpus = listing.gpus
    if request.kind == "none":
        return GpuSelection(request, (), HIDE_ALL_GPUS)
    if request.kind == "all":
        if not gpus:
            return GpuSelection(
                request, (), None, note=f"{_gpus_text(listing)}: training will use the CPU"
            )
        preset = environ.get("CUDA_VISIBLE_DEVICES")
        if preset is not None:
            # Respect a selection made outside mgpu (a scheduler, a launcher) for GPUS=all,
            # and judge only the GPUs it leaves visible (precision, memory, pre-flight).
            return GpuSelection(
                request, visible_gpus(preset, gpus), None,
                note=f"CUDA_VISIBLE_DEVICES={preset!r} was already set and is kept",
            )
        return GpuSelection(request, gpus, ",".join(str(g.index) for g in gpus))
    if request.kind == "indices":
        missing = [i for i in request.indices if i >= len(gpus)]
        if missing:
            raise SettingError(
                f"there is no GPU {missing[0]}: {_gpus_text(listing)}"
            )
        chosen = tuple(gpus[i] for i in request.indices)
        return GpuSelection(request, chosen, ",".join(str(i) for i in request.indices))
    chosen_list = []
    for uuid in request.uuids:
        matches = [g for g in gpus if g.uuid.lower().startswith(uuid.lower())]
        if len(matches) != 1:
            reason = "matches no GPU" if not matches else "matches more than one GPU"
            known = ", ".join(g.uuid for g in gpus) or "none"
            raise SettingError(f"UUID {uuid} {reason}; NVML's UUIDs: {known}")
        chosen_list.append(matches[0])
    return GpuSelection(request, tuple(chosen_list), ",".join(request.uuids))


def apply_gpu_selection(
    selection: GpuSelection, environ: MutableMapping[str, str] | None = None
) -> None:
    """Write the selection into the environment. Must run before TensorFlow is imported."""
    environ = os.environ if environ is None else environ
    environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if selection.cuda_visible_devices is not None:
        environ["CUDA_VISIBLE_DEVICES"] = selection.cuda_visible_devices


@dataclass(frozen=True)
class LogicalDevices:
    """What `configure_virtual_devices` did: the device type split and the devices now seen."""

    device_type: str  # "GPU" or "CPU"
    physical: int
    logical: tuple[str, ...]


def configure_virtual_devices(
    count: int, memory_per_gpu_mib: Sequence[int] | None = None
) -> LogicalDevices:
    """Split each visible GPU (or the CPU when there is none) into `count` logical devices.

    MirroredStrategy then runs `count` replicas per physical device, so multi-replica code
    really runs on a laptop or in CI. Must be called before TensorFlow initialises its
    devices. `count` 0 or 1 leaves the devices as they are.
    """
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if count >= 2:
        if gpus:
            for position, gpu in enumerate(gpus):
                # A GPU's logical devices each need a memory cap; share the free memory.
                free = (
                    memory_per_gpu_mib[position]
                    if memory_per_gpu_mib and position < len(memory_per_gpu_mib)
                    else 4096 * count
                )
                limit = max(256, int(free * 0.9) // count)
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit)] * count
                )
        else:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
            )
    device_type = "GPU" if gpus else "CPU"
    logical: list[Any] = tf.config.list_logical_devices(device_type)
    physical = len(gpus) if gpus else 1
    return LogicalDevices(device_type, physical, tuple(d.name for d in logical))
