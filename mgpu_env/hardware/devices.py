"""Choosing GPUs (before TensorFlow starts) and splitting devices into logical ones.

CUDA reads `CUDA_VISIBLE_DEVICES` once, when TensorFlow first touches the GPU, so the
selection must be written to the environment before TensorFlow is imported. With
`CUDA_DEVICE_ORDER=PCI_BUS_ID`, index 1 is the same card in nvidia-smi, in `mgpu doctor`
and in training (CUDA's default order is "fastest first").
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mgpu_env.config.settings import GpuRequest, SettingError
from mgpu_env.config.text import is_digits, whole_number
from mgpu_env.hardware.nvml import GpuInfo, GpuListing

# CUDA hides every GPU for an id that matches none; "-1" is the documented idiom.
HIDE_ALL_GPUS = "-1"
# TensorFlow creates devices only of the types this lists (core/common_runtime/
# device_factory.cc); "CPU" keeps it from loading the CUDA driver at all.
TF_DEVICE_TYPES = "TF_ENABLED_DEVICE_TYPES"


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
    failed = "".join(f"; GPU {f.index} does not answer NVML ({f.error})" for f in listing.failed)
    if not listing.gpus:
        return "NVML reports no GPUs" + failed
    if failed:
        usable = ", ".join(str(g.index) for g in listing.gpus)
        return f"NVML reports {len(listing.gpus)} usable GPU(s), indices {usable}{failed}"
    return f"NVML reports {len(listing.gpus)} GPU(s), indices 0..{len(listing.gpus) - 1}"


def visible_gpus(cuda_visible_devices: str, gpus: Sequence[GpuInfo]) -> tuple[GpuInfo, ...]:
    """The GPUs a CUDA_VISIBLE_DEVICES value exposes, in its order (indices or UUID prefixes).

    CUDA stops at the first id that matches no device, so "-1" or "" hides every GPU.
    """
    visible: list[GpuInfo] = []
    # By NVML index, not position: a GPU that does not answer NVML is not in `gpus`.
    by_index = {g.index: g for g in gpus}
    for item in (i.strip() for i in cuda_visible_devices.split(",")):
        if is_digits(item) and whole_number(item) in by_index:
            visible.append(by_index[whole_number(item) or 0])
            continue
        matches = [g for g in gpus if item and g.uuid.lower().startswith(item.lower())]
        if len(matches) != 1:
            break
        visible.append(matches[0])
    return tuple(visible)


def select_gpus(
    request: GpuRequest, listing: GpuListing, environ: Mapping[str, str] | None = None
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
    preset = environ.get("CUDA_VISIBLE_DEVICES")
    # The value GPUS writes itself (a child of a run inherits it) is not an assignment.
    own = ",".join(request.uuids if request.kind == "uuids" else map(str, request.indices))
    if preset is not None and preset.replace(" ", "") != own:
        return _within(request, listing, preset)
    if request.kind == "indices":
        by_index = {g.index: g for g in gpus}
        missing = [i for i in request.indices if i not in by_index]
        if missing:
            raise SettingError(
                f"there is no GPU {missing[0]}: {_gpus_text(listing)}"
            )
        chosen = tuple(by_index[i] for i in request.indices)
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


def _within(request: GpuRequest, listing: GpuListing, preset: str) -> GpuSelection:
    """GPUS composed with a CUDA_VISIBLE_DEVICES a scheduler, launcher or the user already set:
    indices count positions within it (GPUS=0 is its first GPU) and UUIDs must be among it,
    so a selection never reaches a GPU the job was not given."""
    visible = visible_gpus(preset, listing.gpus)
    items = [i.strip() for i in preset.split(",")][:len(visible)]
    given = f"CUDA_VISIBLE_DEVICES={preset!r} ({len(visible)} GPU(s))"
    positions: list[int] = []
    if request.kind == "indices":
        beyond = [i for i in request.indices if i >= len(visible)]
        if beyond:
            valid = f"0..{len(visible) - 1}" if visible else "none"
            raise SettingError(
                f"GPUS selects within the GPUs this job was given, {given}: position "
                f"{beyond[0]} is beyond them (valid: {valid}); GPUS=all takes them all")
        positions = list(request.indices)
    else:
        for uuid in request.uuids:
            found = [n for n, g in enumerate(visible) if g.uuid.lower().startswith(uuid.lower())]
            if len(found) != 1:
                raise SettingError(f"UUID {uuid} is not among the GPUs this job was given, "
                                   f"{given}: {', '.join(g.uuid for g in visible) or 'none'}")
            positions.append(found[0])
    chosen = tuple(visible[n] for n in positions)
    note = (f"GPUS={request} selects within {given}: "
            f"{', '.join(f'GPU {g.index}' for g in chosen)}")
    return GpuSelection(request, chosen, ",".join(items[n] for n in positions), note)


def task_share(
    selection: GpuSelection, local_id: int, tasks_on_node: int, node_gpus: int
) -> GpuSelection:
    """The GPUs of task `local_id` of `tasks_on_node` started together on one machine.

    One task per node keeps the whole selection. With several, a device list the scheduler
    already narrowed to this task (as many GPUs or fewer than the node's share) is kept;
    otherwise the selection is cut into equal consecutive shares by local id, one task per
    GPU when there are as many GPUs as tasks. Raises SettingError when the tasks outnumber
    the GPUs.
    """
    gpus = selection.gpus
    if tasks_on_node <= 1 or not gpus:
        return selection
    if selection.cuda_visible_devices is None and len(gpus) * tasks_on_node <= node_gpus:
        return dataclasses.replace(
            selection, note=f"CUDA_VISIBLE_DEVICES was narrowed to this task's {len(gpus)} "
            "GPU(s) by the scheduler and is kept")
    per_task = len(gpus) // tasks_on_node
    if per_task == 0:
        raise SettingError(
            f"{tasks_on_node} tasks run on this machine but {len(gpus)} GPU(s) are selected: "
            "every task needs at least one"
        )
    mine = gpus[local_id * per_task:(local_id + 1) * per_task]
    left = len(gpus) - per_task * tasks_on_node
    note = (f"task {local_id} of {tasks_on_node} on this machine uses GPU(s) "
            f"{','.join(str(g.index) for g in mine)}")
    if left:
        note += f"; {left} GPU(s) stay unused ({len(gpus)} do not divide by {tasks_on_node})"
    return GpuSelection(selection.request, mine, ",".join(str(g.index) for g in mine), note)


def cuda_environment(
    cuda_visible_devices: str | None, *, uses_gpu: bool = True
) -> dict[str, str]:
    """The variables that make CUDA expose exactly these GPUs, in nvidia-smi's order.

    The one place a CUDA_VISIBLE_DEVICES value is turned into environment variables: the
    runtime applies it to this process, `mgpu bench` to each child's environment. None
    leaves CUDA_VISIBLE_DEVICES as the user (or a scheduler) set it. Without a GPU
    (`uses_gpu` false) TensorFlow's GPU device factory is switched off: even with every GPU
    hidden it would call cuInit when it lists devices, and log an ERROR line on a healthy
    CPU run ("failed call to cuInit").
    """
    environment = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if cuda_visible_devices is not None:
        environment["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    if not uses_gpu:
        environment[TF_DEVICE_TYPES] = "CPU"
    return environment


# A logical GPU needs a memory cap; when NVML could not say how much is free, each logical
# device gets this much (a few MLP replicas fit in far less; a 16 GiB GPU holds 4).
DEFAULT_LOGICAL_GPU_MIB = 4096
# What a logical GPU may take of its share of the free memory: CUDA's context, cuDNN's and
# cuBLAS's workspaces live outside TensorFlow's allocator.
LOGICAL_GPU_FRACTION = 0.9
MIN_LOGICAL_GPU_MIB = 256


@dataclass(frozen=True)
class DeviceSplit:
    """How the selected devices become the replicas' devices: each physical device (every
    selected GPU, or the one CPU) split into `per_device` logical devices.

    Decided once (`plan_split`) from VIRTUAL_DEVICES and NVML's free memory, and applied in
    the process that trains (`apply_split`); `mgpu bench` sends it to its children as data.
    """

    device_type: str  # "GPU" or "CPU"
    physical: int
    per_device: int = 1  # 1: no split
    memory_limit_mib: tuple[int, ...] = ()  # per physical GPU, for each of its logical ones

    @property
    def names(self) -> tuple[str, ...]:
        """The devices MirroredStrategy mirrors over, as TensorFlow will name them."""
        count = self.physical * self.per_device
        return tuple(f"/device:{self.device_type}:{i}" for i in range(count))

    @property
    def logical(self) -> bool:
        return self.per_device > 1


def plan_split(virtual_devices: int, gpus: Sequence[GpuInfo]) -> DeviceSplit:
    """The one rule for splitting devices (VIRTUAL_DEVICES 0 or 1: no split).

    A GPU's logical devices share LOGICAL_GPU_FRACTION of its free memory (NVML) equally.
    """
    per_device = virtual_devices if virtual_devices >= 2 else 1
    if not gpus:
        return DeviceSplit("CPU", 1, per_device)
    limits: tuple[int, ...] = ()
    if per_device > 1:
        limits = tuple(
            max(
                MIN_LOGICAL_GPU_MIB,
                int(free * LOGICAL_GPU_FRACTION) // per_device
                if (free := gpu.memory_free_mib.value)
                else DEFAULT_LOGICAL_GPU_MIB,
            )
            for gpu in gpus
        )
    return DeviceSplit("GPU", len(gpus), per_device, limits)


def apply_split(split: DeviceSplit) -> tuple[str, ...]:
    """Make TensorFlow's devices what `split` says; returns the devices' names.

    Touches only TensorFlow's physical-device list, which does not start its runtime, so it
    also runs before MultiWorkerMirroredStrategy ("Collective ops must be configured at
    program startup"). Raises RuntimeError when TensorFlow sees other devices than planned
    (the GPUs were selected but this TensorFlow cannot use them: `mgpu doctor` says why).
    """
    import tensorflow as tf

    physical = tf.config.list_physical_devices(split.device_type)
    if split.device_type == "CPU":
        physical = physical[:1]
    if len(physical) != split.physical:
        raise RuntimeError(
            f"{split.physical} {split.device_type}(s) were selected but TensorFlow sees "
            f"{len(physical)}; run `mgpu doctor` to see why"
        )
    if split.logical:
        for position, device in enumerate(physical):
            current = tf.config.get_logical_device_configuration(device)
            if current is not None and len(current) == split.per_device:
                continue  # already split so (a second run in one process, e.g. a test)
            config = (
                tf.config.LogicalDeviceConfiguration(
                    memory_limit=split.memory_limit_mib[position]
                )
                if split.device_type == "GPU"
                else tf.config.LogicalDeviceConfiguration()
            )
            tf.config.set_logical_device_configuration(device, [config] * split.per_device)
    return split.names
