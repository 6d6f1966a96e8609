"""`mgpu bench`'s plan: which points the sweep measures, on which devices.

The points are replica counts x precision x XLA x data, each with the runtime's decisions for
its child process."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mgpu_env.bench.models import bench_model
from mgpu_env.config.errors import ConfigError
from mgpu_env.config.settings import Settings
from mgpu_env.hardware.devices import GpuSelection
from mgpu_env.runtime import Runtime
from mgpu_env.runtime.decisions import global_batch_size
from mgpu_env.runtime.precision import SETTING_OF_POLICY, PrecisionChoice
from mgpu_env.training.input.keep import FALLBACK_BYTES

RESULT_PREFIX = "MGPU_BENCH_RESULT "


@dataclass(frozen=True)
class PointSpec:
    """Everything a child needs to measure one sweep point; travels to it as JSON."""

    model: str
    replicas: int
    per_replica_batch: int
    mixed_precision: str  # "0" (fp32), "1", "fp16", "bf16"
    xla: bool
    data: str  # "synthetic", "real" (kept on each device) or "stream" (tf.data)
    dataset: str
    data_dir: str | None
    warmup_steps: int
    steps_per_interval: int
    intervals: int
    seed: int
    learning_rate: float
    cross_device_ops: str
    virtual_devices: int  # the logical split the child makes (0: none)
    cuda_visible_devices: str | None  # None: inherit the parent's
    runner: str = "mgpu"  # "mgpu" (the packaged step) or "seed" (the seed's model.fit)
    deterministic: bool = True  # DATA_DETERMINISTIC, for the stream
    # BENCH_EXPLAIN: the TensorBoard log folder the child profiles this point into
    # (`bench.explain`); empty: no profile.
    profile_dir: str = ""
    # The runtime's decisions for this point (`Execution` as JSON: environment, device
    # split, precision, strategy), made by the parent; the child applies them.
    execution: str = ""
    # Training's keep limit on this machine (`training.run.plan.plan_keep`), decided once by
    # the parent: whether DATASET's files are read whole here, as `mgpu train` decides it.
    keep_bytes: int = FALLBACK_BYTES

    @property
    def global_batch(self) -> int:
        return global_batch_size(self.per_replica_batch, self.replicas)

    @property
    def precision(self) -> str:
        return "fp32" if self.mixed_precision == "0" else f"mixed({self.mixed_precision})"

    @property
    def variant(self) -> str:
        """The series this point belongs to (all but the replica count), e.g. fp32+xla."""
        parts = [self.precision]
        if self.xla:
            parts.append("xla")
        if self.data != "synthetic":
            parts.append(f"{self.data}-data")
        if self.runner != "mgpu":
            parts.append(self.runner)
        return "+".join(parts)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PointSpec:
        return cls(**json.loads(text))


Group = tuple[PointSpec, ...]  # points one child measures, their intervals interleaved


def group_points(specs: Sequence[PointSpec]) -> list[Group]:
    """The points that differ only in their data, each group for one child, in the order
    of their first point: their intervals take turns there, so a change of the machine's
    load hits each data variant alike (`rounds`)."""
    groups: dict[PointSpec, list[PointSpec]] = {}
    for spec in specs:
        key = dataclasses.replace(spec, data="", profile_dir="")
        groups.setdefault(key, []).append(spec)
    return [tuple(group) for group in groups.values()]


def describe_group(group: Group) -> str:
    """How errors name a group: "the 2-replica point (fp32; synthetic, real data)"."""
    first = group[0]
    what = first.variant.split("+")
    what = [part for part in what if not part.endswith("-data")]
    if len(group) > 1 or first.data != "synthetic":
        what.append(", ".join(spec.data for spec in group) + " data")
    return f"the {first.replicas}-replica point ({'; '.join(what)})"


@dataclass(frozen=True)
class DevicePlan:
    """Which devices the sweep spreads over, and how each replica count gets its devices."""

    kind: str  # "GPU" or "CPU"
    logical: bool  # replicas are logical devices sharing one physical device
    max_replicas: int
    gpu_ids: tuple[str, ...]  # CUDA_VISIBLE_DEVICES items, in order, for physical GPUs
    gpus: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()

    def child_devices(self, replicas: int) -> tuple[int, str | None]:
        """(VIRTUAL_DEVICES, CUDA_VISIBLE_DEVICES) for a child running `replicas` replicas."""
        split = replicas if self.logical and replicas >= 2 else 0
        if self.kind == "CPU":
            return split, None
        ids = self.gpu_ids[:1] if self.logical else self.gpu_ids[:replicas]
        return split, ",".join(ids)


def power_of_two_counts(maximum: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to `maximum`, and `maximum` itself when it is not a power of two."""
    counts = []
    n = 1
    while n <= maximum:
        counts.append(n)
        n *= 2
    if counts[-1] != maximum:
        counts.append(maximum)
    return tuple(counts)


def plan_devices(
    settings: Settings, selection: GpuSelection, environ: Mapping[str, str]
) -> DevicePlan:
    """Decide what the replica sweep runs on, from the GPU selection and VIRTUAL_DEVICES."""
    split = settings.virtual_devices
    gpus = tuple(
        {"index": g.index, "name": g.name, "uuid": g.uuid} for g in selection.gpus
    )
    if selection.gpus:
        visible = selection.cuda_visible_devices
        if visible is None:
            visible = environ.get("CUDA_VISIBLE_DEVICES", "")
        ids = tuple(i.strip() for i in visible.split(",") if i.strip()) or tuple(
            str(g.index) for g in selection.gpus
        )
        if split >= 2:
            return DevicePlan(
                "GPU", True, split, ids, gpus,
                notes=(
                    f"replicas are logical devices of GPU {ids[0]} (VIRTUAL_DEVICES={split}); "
                    "they share its compute, so efficiency below 100% is expected",
                ),
            )
        return DevicePlan("GPU", False, len(ids), ids, gpus)
    if split >= 2:
        return DevicePlan(
            "CPU", True, split, (),
            notes=(
                f"replicas are {split} logical devices of one CPU sharing its cores "
                f"({os.cpu_count()} here): efficiency measures overhead, not a speed-up; "
                "run on GPUs for real scaling",
            ),
        )
    return DevicePlan(
        "CPU", False, 1, (),
        notes=("no GPU: only 1 replica; set VIRTUAL_DEVICES=4 to sweep logical CPU devices",),
    )


def replica_counts(settings: Settings, devices: DevicePlan) -> tuple[int, ...]:
    """The replica counts to sweep; raises ConfigError for counts the devices cannot run."""
    if not settings.bench_replicas:
        return power_of_two_counts(devices.max_replicas)
    too_many = [n for n in settings.bench_replicas if n > devices.max_replicas]
    if too_many:
        if devices.kind == "GPU" and not devices.logical:
            fix = (
                f"{devices.max_replicas} GPU(s) are selected; select more with GPUS, or "
                f"set VIRTUAL_DEVICES={too_many[-1]} to split one GPU"
            )
        else:
            fix = f"set VIRTUAL_DEVICES={too_many[-1]} (now {settings.virtual_devices or 0})"
        raise ConfigError(
            f"Bad setting BENCH_REPLICAS={','.join(map(str, settings.bench_replicas))}: "
            f"{too_many[0]} replicas, but at most {devices.max_replicas} can run here.\n"
            f"  Valid: auto, or counts up to {devices.max_replicas}. Fix: {fix}, or lower "
            "BENCH_REPLICAS."
        )
    return settings.bench_replicas


def sweep_precisions(settings: Settings, precision: PrecisionChoice) -> list[str]:
    """The MIXED_PRECISION values the sweep runs, each naming its policy outright: the one
    the runtime decided for MIXED_PRECISION, and with BENCH_SWEEP=precision float32 beside
    it (or, when that was float32, what MIXED_PRECISION=1 picks on these devices), so the
    table says which one ran."""
    if "precision" not in settings.bench_sweep:
        return [precision.setting]
    other = precision.setting if settings.mixed_precision != "0" else \
        SETTING_OF_POLICY[precision.fastest]
    return list(dict.fromkeys(["0", other]))


def plan_points(
    settings: Settings, devices: DevicePlan, precision: PrecisionChoice
) -> list[PointSpec]:
    """Every point of the sweep: each variant (precision, XLA, data) at each replica count.
    `precision`: the runtime's decision for MIXED_PRECISION on these devices."""
    modes = sweep_precisions(settings, precision)
    xlas = [False, True] if "xla" in settings.bench_sweep else [settings.xla]
    datas = {"both": ["synthetic", "real"], "all": ["synthetic", "real", "stream"]}.get(
        settings.bench_data, [settings.bench_data]
    )
    points = []
    for data in datas:
        for mode in modes:
            for xla in xlas:
                for n in replica_counts(settings, devices):
                    split, visible = devices.child_devices(n)
                    points.append(
                        PointSpec(
                            model=bench_model(settings.model, settings.bench_model),
                            replicas=n,
                            per_replica_batch=settings.batch_size,
                            mixed_precision=mode, xla=xla, data=data,
                            dataset=settings.dataset,
                            data_dir=str(settings.data_dir) if settings.data_dir else None,
                            warmup_steps=settings.bench_warmup,
                            steps_per_interval=settings.bench_steps,
                            intervals=settings.bench_intervals, seed=settings.seed,
                            learning_rate=settings.learning_rate,
                            cross_device_ops=settings.cross_device_ops,
                            virtual_devices=split, cuda_visible_devices=visible,
                            deterministic=settings.data_deterministic,
                        )
                    )
    return points


def comparison_points(settings: Settings, devices: DevicePlan) -> tuple[PointSpec, PointSpec]:
    """The seed's plain `model.fit` and the packaged step, on one replica, same data and batch.

    The seed has neither mixed precision nor XLA, so both run fp32 without XLA, on the MLP
    (the seed's model) and synthetic MNIST-shaped data: a DATASET loader, whose samples
    would give the model their shape, is left out (the sweep's point is then not reused).
    """
    split, visible = devices.child_devices(1)
    loader = ":" in settings.dataset
    mgpu = PointSpec(
        model="mlp", replicas=1, per_replica_batch=settings.batch_size, mixed_precision="0",
        xla=False, data="synthetic", dataset="synthetic" if loader else settings.dataset,
        data_dir=str(settings.data_dir) if settings.data_dir and not loader else None,
        warmup_steps=settings.bench_warmup, steps_per_interval=settings.bench_steps,
        intervals=settings.bench_intervals, seed=settings.seed,
        learning_rate=settings.learning_rate, cross_device_ops=settings.cross_device_ops,
        virtual_devices=split, cuda_visible_devices=visible,
    )
    return dataclasses.replace(mgpu, runner="seed"), mgpu


def attach_executions(
    specs: Sequence[PointSpec], devices: DevicePlan, runtime: Runtime
) -> list[PointSpec]:
    """Each point with the runtime's decisions for its devices and precision, made by the
    same rules as `mgpu train`'s. Raises ConfigError (exit 2) before any child starts when
    a precision or all-reduce cannot run on these devices."""
    attached = []
    for spec in specs:
        gpus = runtime.selection.gpus
        chosen = () if devices.kind == "CPU" else (
            gpus[:1] if devices.logical else gpus[:spec.replicas]
        )
        execution = runtime.execution_for(
            chosen, spec.cuda_visible_devices, virtual_devices=spec.virtual_devices,
            mixed_precision=spec.mixed_precision,
        )
        attached.append(dataclasses.replace(spec, execution=execution.to_json()))
    return attached


