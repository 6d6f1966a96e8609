"""`mgpu bench`: does N replicas give N times the speed, and what is lost to sync and input?

The parent process plans a sweep (replica counts x precision x XLA x data), runs every
point in a child process of its own (`python -m mgpu_env.bench.worker`), because a
logical-device split and CUDA_VISIBLE_DEVICES are fixed once per process, collects one JSON
line from each child, and aggregates: median and spread of samples/s over several timed
intervals (warm-up excluded), per-replica samples/s, step time, scaling efficiency against
the fewest replicas, the input pipeline's cost, and optionally the ratio to the seed's
plain `model.fit`. Nothing here imports TensorFlow; the children do.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mgpu_env.bench.models import bench_model
from mgpu_env.bench.stats import efficiencies, input_pipeline_cost, summarize_point
from mgpu_env.config.errors import ConfigError, RunFailed
from mgpu_env.config.settings import Settings
from mgpu_env.hardware.devices import GpuSelection
from mgpu_env.runtime import Execution, Runtime
from mgpu_env.training import rundir

RESULT_PREFIX = "MGPU_BENCH_RESULT "
BENCH_JSON = "bench.json"
BENCH_PNG = "bench.png"
SCHEMA_VERSION = 1


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
    # The runtime's decisions for this point (`Execution` as JSON: environment, device
    # split, precision, strategy), made by the parent; the child applies them.
    execution: str = ""

    @property
    def global_batch(self) -> int:
        return self.per_replica_batch * self.replicas

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


_POLICY_MODES = {"float32": "0", "mixed_float16": "fp16", "mixed_bfloat16": "bf16"}


def plan_points(
    settings: Settings,
    devices: DevicePlan,
    capabilities: Sequence[tuple[int, int] | None] = (),
    cpu_flags: frozenset[str] | None = None,
) -> list[PointSpec]:
    """Every point of the sweep: each variant (precision, XLA, data) at each replica count.

    MIXED_PRECISION=1 is resolved here, with the training module's rule for these devices
    (fp16 on GPUs with tensor cores, bf16 on the CPU), so the table says which one ran.
    """
    from mgpu_env.training.precision import choose_precision

    mixed = settings.mixed_precision
    wanted = ["0", mixed if mixed != "0" else "1"] if "precision" in settings.bench_sweep \
        else [mixed]
    precisions = list(dict.fromkeys(
        _POLICY_MODES[choose_precision(mode, devices.kind, capabilities, cpu_flags).policy]
        if mode == "1" else mode
        for mode in wanted
    ))
    xlas = [False, True] if "xla" in settings.bench_sweep else [settings.xla]
    datas = {"both": ["synthetic", "real"], "all": ["synthetic", "real", "stream"]}.get(
        settings.bench_data, [settings.bench_data]
    )
    points = []
    for data in datas:
        for precision in precisions:
            for xla in xlas:
                for n in replica_counts(settings, devices):
                    split, visible = devices.child_devices(n)
                    points.append(
                        PointSpec(
                            model=bench_model(settings.model, settings.bench_model),
                            replicas=n,
                            per_replica_batch=settings.batch_size,
                            mixed_precision=precision, xla=xla, data=data,
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
    (the seed's model) and synthetic MNIST-shaped data.
    """
    split, visible = devices.child_devices(1)
    mgpu = PointSpec(
        model="mlp", replicas=1, per_replica_batch=settings.batch_size, mixed_precision="0",
        xla=False, data="synthetic", dataset=settings.dataset,
        data_dir=str(settings.data_dir) if settings.data_dir else None,
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


# ------------------------------------------------------------------------------ children

ChildRunner = Callable[[PointSpec], dict[str, Any]]  # run_child with its timeout bound


def child_environment(spec: PointSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment with the point's own (its GPUs, the runtime's variables)."""
    env = dict(environ)
    Execution.from_json(spec.execution).apply(env)
    return env


def parse_child_output(stdout: str) -> dict[str, Any] | None:
    """The result a child printed: the last line that starts with RESULT_PREFIX."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX):])
            return result
    return None


def run_child(spec: PointSpec, timeout_s: float | None = None) -> dict[str, Any]:
    """Measure one point in a fresh Python process; raises RunFailed if it fails."""
    completed = subprocess.run(
        [sys.executable, "-m", "mgpu_env.bench.worker", spec.to_json()],
        env=child_environment(spec, os.environ), capture_output=True, text=True,
        timeout=timeout_s, check=False,
    )
    result = parse_child_output(completed.stdout)
    if result is not None and "error" in result:
        raise RunFailed(f"the {spec.replicas}-replica point ({spec.variant}): {result['error']}")
    if completed.returncode != 0 or result is None:
        tail = "\n    ".join((completed.stderr or completed.stdout).strip().splitlines()[-6:])
        raise RunFailed(
            f"the {spec.replicas}-replica point ({spec.variant}) failed with exit code "
            f"{completed.returncode}:\n    {tail}"
        )
    return result


# ------------------------------------------------------------------------------ the sweep


@dataclass
class BenchReport:
    """Everything `mgpu bench` measured; `as_dict()` is the content of bench.json."""

    settings: dict[str, str]
    devices: DevicePlan
    method: dict[str, Any]
    points: list[dict[str, Any]] = field(default_factory=list)
    seed_comparison: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    created: str = field(
        default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    )

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [p for p in self.points if p.get("error")]

    def series(self) -> dict[str, list[dict[str, Any]]]:
        """Successful points grouped by variant, sorted by replicas."""
        grouped: dict[str, list[dict[str, Any]]] = {}
        for point in self.points:
            if not point.get("error"):
                grouped.setdefault(point["variant"], []).append(point)
        return {k: sorted(v, key=lambda p: p["replicas"]) for k, v in grouped.items()}

    def as_dict(self) -> dict[str, Any]:
        series = self.series()
        return {
            "schema": SCHEMA_VERSION,
            "created": self.created,
            "settings": self.settings,
            "devices": dataclasses.asdict(self.devices),
            "method": self.method,
            "points": self.points,
            "efficiency": {
                variant: {str(p["replicas"]): p["efficiency"] for p in points}
                for variant, points in series.items()
            },
            "input_pipeline_cost": input_costs(self.points),
            "seed_comparison": self.seed_comparison,
            "notes": self.notes,
        }


def point_record(spec: PointSpec, child: Mapping[str, Any]) -> dict[str, Any]:
    """One point of bench.json: its settings, the child's raw timings and the summary."""
    record: dict[str, Any] = {
        "variant": spec.variant,
        "replicas": spec.replicas,
        "model": spec.model,
        "precision": spec.precision,
        "mixed_precision": spec.mixed_precision,
        "xla": spec.xla,
        "data": spec.data,
        "runner": spec.runner,
        "per_replica_batch": spec.per_replica_batch,
        "global_batch": spec.global_batch,
        "virtual_devices": spec.virtual_devices,
        "cuda_visible_devices": spec.cuda_visible_devices,
    }
    if "error" in child:
        record["error"] = child["error"]
        return record
    record.update(
        summarize_point(
            child["interval_seconds"], spec.steps_per_interval, spec.global_batch, spec.replicas
        )
    )
    record["interval_seconds"] = child["interval_seconds"]
    record["worker"] = {k: v for k, v in child.items() if k != "interval_seconds"}
    return record


def add_efficiencies(points: list[dict[str, Any]]) -> None:
    """Set each successful point's efficiency against the fewest replicas of its variant."""
    by_variant: dict[str, dict[int, float]] = {}
    for point in points:
        if not point.get("error"):
            by_variant.setdefault(point["variant"], {})[point["replicas"]] = point[
                "samples_per_s"
            ]["median"]
    for point in points:
        if point.get("error"):
            continue
        table = by_variant[point["variant"]]
        point["efficiency"] = efficiencies(table)[point["replicas"]]
        point["efficiency_base_replicas"] = min(table)


def input_costs(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each real- or stream-data point with a synthetic twin: the throughput its input
    path costs."""
    synthetic = {
        (p["replicas"], p["mixed_precision"], p["xla"], p["runner"]): p
        for p in points
        if p["data"] == "synthetic" and not p.get("error")
    }
    costs = []
    for real in points:
        if real["data"] == "synthetic" or real.get("error"):
            continue
        twin = synthetic.get((real["replicas"], real["mixed_precision"], real["xla"],
                              real["runner"]))
        if twin is None:
            continue
        synth_tp = twin["samples_per_s"]["median"]
        real_tp = real["samples_per_s"]["median"]
        costs.append({
            "replicas": real["replicas"],
            "data": real["data"],
            "precision": real["precision"],
            "xla": real["xla"],
            "synthetic_samples_per_s": synth_tp,
            "real_samples_per_s": real_tp,
            "throughput_lost": input_pipeline_cost(synth_tp, real_tp),
            "step_time_added_ms": real["step_time_ms"]["median"] - twin["step_time_ms"]["median"],
            # The two means differ by more than their 95% CIs together: not just noise.
            "significant": abs(twin["samples_per_s"]["mean"] - real["samples_per_s"]["mean"])
            > twin["samples_per_s"]["ci95"] + real["samples_per_s"]["ci95"],
        })
    return costs


def run_bench(
    runtime: Runtime,
    *,
    environ: Mapping[str, str] | None = None,
    runner: ChildRunner | None = None,
    on_point: Callable[[dict[str, Any], int, int], None] | None = None,
) -> BenchReport:
    """Run the sweep (and the seed comparison if BENCH_COMPARE) and return the report.

    A point whose child fails is recorded with its error and the sweep goes on; the caller
    decides the exit code from `report.failed`. Raises ConfigError for an impossible plan.
    """
    environ = os.environ if environ is None else environ
    settings = runtime.settings
    if ":" in settings.model:
        # A builder that cannot be imported is a bad setting (exit 2), found before any
        # child starts rather than as a failure of every point.
        from mgpu_env.training import hooks

        hooks.import_hook(settings.model, "MODEL", hooks.MODEL_CONTRACT)
    if runner is None:
        runner = functools.partial(run_child, timeout_s=settings.bench_timeout)
    devices = plan_devices(settings, runtime.selection, environ)
    specs = attach_executions(
        plan_points(settings, devices, runtime.compute_capabilities(), runtime.cpu_flags),
        devices, runtime,
    )
    comparison = None
    if settings.bench_compare:
        seed_spec, mgpu_spec = attach_executions(
            comparison_points(settings, devices), devices, runtime
        )
        comparison = (seed_spec, mgpu_spec)
    report = BenchReport(
        settings=settings.describe(),
        devices=devices,
        method={
            "scaling": "weak: global batch = per-replica batch x replicas",
            "efficiency": "throughput(n) / (n x throughput(base)); base = fewest replicas",
            "warmup_steps": settings.bench_warmup,
            "steps_per_interval": settings.bench_steps,
            "intervals": settings.bench_intervals,
            "timing": "time.perf_counter around each interval, ended by fetching the loss "
            "to the host; warm-up (tracing, compilation) excluded",
            "spread": "median, quartiles, min/max and mean with its 95% CI over intervals",
            "process_per_point": True,
        },
        notes=list(devices.notes),
    )
    queue = list(specs)
    if comparison is not None:
        # The seed runs first; its mgpu twin is reused from the sweep when it is there.
        queue.insert(0, comparison[0])
        if comparison[1] not in specs:
            queue.insert(1, comparison[1])
    measured: dict[PointSpec, dict[str, Any]] = {}
    for done, spec in enumerate(queue, start=1):
        record = _measure(spec, runner)
        measured[spec] = record
        if spec in specs:
            report.points.append(record)
        if on_point:
            on_point(record, done, len(queue))
    add_efficiencies(report.points)
    if comparison is not None:
        seed_spec, mgpu_spec = comparison
        seed, twin = measured[seed_spec], measured[mgpu_spec]
        report.seed_comparison = seed_comparison(seed, twin)
    return report


def _measure(spec: PointSpec, runner: ChildRunner) -> dict[str, Any]:
    try:
        child = runner(spec)
    except RunFailed as err:
        child = {"error": str(err)}
    except subprocess.TimeoutExpired as err:
        child = {"error": f"timed out after {err.timeout:.0f} s"}
    return point_record(spec, child)


def seed_comparison(seed: dict[str, Any], mgpu: dict[str, Any]) -> dict[str, Any]:
    """The seed's `model.fit` against the packaged step: samples/s of each and the ratio."""
    result: dict[str, Any] = {
        "what": "seed's plain model.fit (steps_per_execution 1, numpy input) vs mgpu's "
        "step (several steps per tf.function call, data on device); 1 replica, fp32, "
        "no XLA, MLP, same synthetic data and per-replica batch",
        "seed": seed,
        "mgpu": mgpu,
    }
    if seed.get("error") or mgpu.get("error"):
        result["ratio"] = None
        result["error"] = seed.get("error") or mgpu.get("error")
        return result
    result["seed_samples_per_s"] = seed["samples_per_s"]["median"]
    result["mgpu_samples_per_s"] = mgpu["samples_per_s"]["median"]
    result["ratio"] = result["mgpu_samples_per_s"] / result["seed_samples_per_s"]
    return result


def write_report(report: BenchReport, output_dir: Path) -> Path:
    """Write bench.json under `output_dir` (created) and return its path."""
    # Atomic, like the run folder's files: a kill mid-write leaves the earlier bench.json.
    path = output_dir / BENCH_JSON
    rundir.atomic_write_json(path, report.as_dict())
    return path


def default_output_dir(settings: Settings) -> Path:
    """OUTPUT_DIR, or runs/bench-<RUN_NAME or UTC timestamp> (training's names, prefixed)."""
    if settings.output_dir is not None:
        return settings.output_dir
    run_folder = rundir.default_output_dir(settings.run_name)
    return run_folder.with_name(f"bench-{run_folder.name}")
