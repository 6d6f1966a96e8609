"""One factory from settings and devices to a `tf.distribute` strategy.

`plan_strategy` is pure: devices, platform facts and `CROSS_DEVICE_OPS` in, a
`StrategyPlan` out (what runs where, which all-reduce and why), so each branch is tested
without GPUs. `make_strategy` turns the plan into the strategy object.

- Several devices (GPUs, or the logical devices of VIRTUAL_DEVICES): MirroredStrategy.
- One device: MirroredStrategy with that one device, so one code path serves every count.
- `TF_CONFIG` set: MultiWorkerMirroredStrategy; its `WorkerRole` says whether this process
  is the chief, the one that writes checkpoints, logs, the model and metrics.json.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mgpu_env.config.errors import ConfigError
from mgpu_env.hardware.devices import DeviceSplit

CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduction_to_one")
StrategyKind = Literal["mirrored", "multi_worker"]


@dataclass(frozen=True)
class WorkerRole:
    """This process's place in the cluster; a single-process run is the chief of one."""

    task_type: str = "chief"
    task_id: int = 0
    num_workers: int = 1

    @property
    def is_chief(self) -> bool:
        """The chief writes the outputs; the other workers train and write nothing."""
        return self.task_type == "chief" or (
            self.task_type == "worker" and self.task_id == 0 and not self._has_chief
        )

    _has_chief: bool = field(default=True, repr=False)


SINGLE_PROCESS = WorkerRole()


@dataclass(frozen=True)
class StrategyPlan:
    """What the strategy will be: devices, replicas, all-reduce and the reason for it."""

    kind: StrategyKind
    devices: tuple[str, ...]
    device_type: str  # "GPU" or "CPU"
    physical_devices: int  # devices the logical ones were split from
    cross_device_ops: str  # nccl, hierarchical_copy, reduction_to_one, ring, none
    reason: str
    role: WorkerRole = SINGLE_PROCESS
    note: str = ""  # a CROSS_DEVICE_OPS request that does not apply here, said aloud

    @property
    def local_replicas(self) -> int:
        return len(self.devices)

    @property
    def logical_split(self) -> bool:
        return len(self.devices) > self.physical_devices


def nccl_possible(platform: str = sys.platform, built_with_cuda: bool = True) -> bool:
    """NCCL ships only in TensorFlow's Linux CUDA builds."""
    return platform.startswith("linux") and built_with_cuda


def _invalid(value: str, why: str, valid: Sequence[str]) -> ConfigError:
    return ConfigError(
        f"CROSS_DEVICE_OPS={value} cannot work here: {why}.\n"
        f"  Valid values here are [{', '.join(valid)}]. Supplied value: {value}."
    )


def plan_strategy(
    requested: str,
    split: DeviceSplit,
    *,
    nccl_available: bool = True,
    role: WorkerRole | None = None,
) -> StrategyPlan:
    """Choose the strategy and the all-reduce for these devices. Raises ConfigError.

    `split` names the logical devices MirroredStrategy will mirror over and how many real
    devices they come from (fewer when VIRTUAL_DEVICES split them); `requested` is
    CROSS_DEVICE_OPS.
    """
    if requested not in CROSS_DEVICE_OPS:
        raise ConfigError(
            f"Valid values for CROSS_DEVICE_OPS are [{', '.join(CROSS_DEVICE_OPS)}]. "
            f"Supplied value: {requested}."
        )
    devices, device_type, physical_devices = split.names, split.device_type, split.physical
    if not devices:
        raise ConfigError("No device to train on: TensorFlow lists no CPU or GPU.")
    if role is not None:
        ops, note = _between_workers(requested, device_type == "GPU",
                                     len(devices) > physical_devices, nccl_available)
        return StrategyPlan(
            "multi_worker", devices, device_type, physical_devices, ops,
            f"the cluster has {role.num_workers} worker(s); collectives use {ops}", role,
            note=note,
        )
    if len(devices) == 1:
        return StrategyPlan(
            "mirrored", devices, device_type, physical_devices, "none",
            "one replica: nothing to all-reduce",
            note=(f"CROSS_DEVICE_OPS={requested} is not used: with one replica there is "
                  "nothing to all-reduce") if requested != "auto" else "",
        )
    if requested == "nccl":
        _check_nccl(len(devices), device_type, physical_devices, nccl_available)
        return StrategyPlan("mirrored", devices, device_type, physical_devices, "nccl",
                            "CROSS_DEVICE_OPS=nccl")
    if requested != "auto":
        return StrategyPlan("mirrored", devices, device_type, physical_devices, requested,
                            f"CROSS_DEVICE_OPS={requested}")
    chosen, why = _auto_all_reduce(device_type == "GPU", len(devices) > physical_devices,
                                   nccl_available)
    return StrategyPlan("mirrored", devices, device_type, physical_devices, chosen, why)


def _between_workers(
    requested: str, on_gpu: bool, shared: bool, nccl_available: bool
) -> tuple[str, str]:
    """The collectives between workers, and a note when CROSS_DEVICE_OPS asked for others:
    MultiWorkerMirroredStrategy's collectives use NCCL on GPUs that are not shared (split by
    VIRTUAL_DEVICES) and ring all-reduce otherwise; CROSS_DEVICE_OPS=nccl forces NCCL."""
    if requested == "nccl" and not (on_gpu and nccl_available):
        raise _invalid(requested, "NCCL needs GPUs and a Linux CUDA build", ["auto"])
    ops = "nccl" if on_gpu and nccl_available and not shared else "ring"
    ignored = requested not in ("auto", ops)
    return ops, (f"CROSS_DEVICE_OPS={requested} is not used: between workers the "
                 f"collectives use {ops}") if ignored else ""


def _check_nccl(
    replicas: int, device_type: str, physical_devices: int, nccl_available: bool
) -> None:
    """CROSS_DEVICE_OPS=nccl between replicas on one machine: a ConfigError when it cannot
    work here."""
    without_nccl = ["auto", "hierarchical_copy", "reduction_to_one"]
    if device_type != "GPU":
        raise _invalid("nccl", "NCCL runs between GPUs, and these are CPU devices",
                       without_nccl)
    if replicas > physical_devices:
        raise _invalid(
            "nccl",
            f"the {replicas} logical GPUs share {physical_devices} physical GPU(s) "
            "(VIRTUAL_DEVICES), and NCCL needs one GPU per rank",
            without_nccl,
        )
    if not nccl_available:
        raise _invalid("nccl", "this platform's TensorFlow has no NCCL", without_nccl)


def _auto_all_reduce(on_gpu: bool, shared: bool, nccl_available: bool) -> tuple[str, str]:
    """CROSS_DEVICE_OPS=auto between several replicas: the all-reduce, and why."""
    if not on_gpu:
        return "reduction_to_one", "auto: CPU devices have no NCCL"
    if shared:
        return "reduction_to_one", (
            "auto: the logical GPUs share a physical GPU, where NCCL cannot work"
        )
    if not nccl_available:
        return "hierarchical_copy", "auto: this platform's TensorFlow has no NCCL"
    return "nccl", "auto: one physical GPU per replica, NCCL available"


def mirrored_devices(plan: StrategyPlan) -> tuple[tuple[str, ...], str | None]:
    """The devices MirroredStrategy mirrors over: the plan's, checked against the devices
    TensorFlow lists now (`tf.config.list_logical_devices`, which starts its runtime).

    A script may split the devices itself before its first strategy (TensorFlow's
    distributed-input tutorial splits the CPU in 2), and TensorFlow then maps a planned
    device that does not exist onto device 0: 4 replicas on CPU:0, CPU:1, CPU:0, CPU:0.
    So when a planned device is missing, the devices that exist are used, never more
    replicas than devices, and the second value says so (None when the plan holds).
    """
    import tensorflow as tf

    listed = tuple(device.name for device in tf.config.list_logical_devices(plan.device_type))
    if not listed or set(plan.devices) <= set(listed):
        return plan.devices, None
    return listed, (
        f"TensorFlow lists {len(listed)} {plan.device_type} device(s), not the "
        f"{plan.local_replicas} planned ({', '.join(plan.devices)}): the script set up the "
        f"devices itself, so MirroredStrategy runs {len(listed)} replica(s), on "
        f"{', '.join(listed)}"
    )


def make_strategy(plan: StrategyPlan) -> Any:
    """Build the tf.distribute strategy the plan describes; when the devices are not the
    plan's (`mirrored_devices`), the ones that exist, with a note on stderr."""
    import tensorflow as tf

    if plan.kind == "multi_worker":
        implementation = (
            tf.distribute.experimental.CommunicationImplementation.NCCL
            if plan.cross_device_ops == "nccl"
            else tf.distribute.experimental.CommunicationImplementation.RING
        )
        return tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=implementation
            )
        )
    devices, changed = mirrored_devices(plan)
    if changed is not None:
        print_note(changed)
    return tf.distribute.MirroredStrategy(
        list(devices), cross_device_ops=make_cross_device_ops(plan)
    )


_NOTED: set[str] = set()


def print_note(line: str) -> None:
    """A note from inside the user's run, on stderr (its stdout stays its own); once per
    process, however many strategies the script builds."""
    if line not in _NOTED:
        _NOTED.add(line)
        print(f"mgpu: note: {line}", file=sys.stderr, flush=True)


def make_cross_device_ops(plan: StrategyPlan) -> Any:
    """MirroredStrategy's all-reduce object for the plan's choice."""
    import tensorflow as tf

    if plan.cross_device_ops == "nccl":
        return tf.distribute.NcclAllReduce()
    if plan.cross_device_ops == "hierarchical_copy":
        return tf.distribute.HierarchicalCopyAllReduce()
    if plan.cross_device_ops in ("reduction_to_one", "none"):
        return tf.distribute.ReductionToOneDevice()
    return None
