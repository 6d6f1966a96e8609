"""`mgpu bench`: does N replicas give N times the speed, and what is lost to sync and input?

The parent process plans a sweep (replica counts x precision x XLA x data) and runs the
points that differ only in their data in one child process (`python -m
mgpu_env.bench.worker`), their intervals taking turns (`rounds`), a child per replica count,
precision and XLA setting, because a logical-device split and CUDA_VISIBLE_DEVICES are
fixed once per process. It collects one JSON line from each child and aggregates: median
and spread of samples/s over several timed intervals (warm-up excluded), per-replica
samples/s, step time, scaling efficiency against the fewest replicas, the input pipeline's
cost round by round, what a streamed input gives alone, and optionally the ratio to the
seed's plain `model.fit`. Nothing here imports TensorFlow; the children do.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mgpu_env.bench.explain import explain_points
from mgpu_env.bench.plan import (
    RESULT_PREFIX,
    DevicePlan,
    Group,
    PointSpec,
    attach_executions,
    comparison_points,
    describe_group,
    group_points,
    plan_devices,
    plan_points,
    power_of_two_counts,
    replica_counts,
)
from mgpu_env.bench.results import (
    BENCH_JSON,
    SCHEMA_VERSION,
    BenchResults,
    add_efficiencies,
    chunk_notes,
    input_alone_verdicts,
    input_costs,
    point_record,
    seed_comparison,
    write_results,
)
from mgpu_env.config.errors import RunFailed
from mgpu_env.doctor import links
from mgpu_env.runtime import Execution, Runtime

BENCH_PNG = "bench.png"

__all__ = [
    "BENCH_JSON",
    "BENCH_PNG",
    "RESULT_PREFIX",
    "SCHEMA_VERSION",
    "BenchResults",
    "DevicePlan",
    "Group",
    "PointSpec",
    "add_efficiencies",
    "attach_executions",
    "comparison_points",
    "group_points",
    "input_alone_verdicts",
    "input_costs",
    "plan_as_dict",
    "plan_bench",
    "plan_devices",
    "plan_points",
    "point_record",
    "power_of_two_counts",
    "replica_counts",
    "run_bench",
    "run_child",
    "seed_comparison",
    "write_results",
]


# How bench.json's numbers were made (the settings' counts are added per run).
METHOD: dict[str, Any] = {
    "scaling": "weak: global batch = per-replica batch x replicas",
    "efficiency": "throughput(n) / (n x throughput(base)); base = fewest replicas",
    "timing": "time.perf_counter around each interval, ended by fetching the loss "
    "to the host; warm-up (tracing, compilation) excluded",
    "spread": "median, quartiles, min/max and mean with its 95% CI over intervals",
    "process_per_point": False,
    "interleaved": "the points that differ only in their data run in one process: "
    "each warmed up, then rounds of one interval of each in turn (the order changes "
    "every round), so a change of the machine's load hits them alike",
    "input_cost": "1 - samples/s of the data / samples/s of synthetic, per round "
    "(the two intervals of one round); median and spread over the rounds",
    "input_alone": "a streamed feed's distributed dataset iterated with no step, "
    "after the rounds, in the same process; samples counted from the elements",
}


# ------------------------------------------------------------------------------ children

# run_child with its timeout bound: a group of points -> each point's result
ChildRunner = Callable[[Group], list[dict[str, Any]]]


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


def run_child(group: Group, timeout_s: float | None = None) -> list[dict[str, Any]]:
    """Measure a group of points (`group_points`) in a fresh Python process: each point's
    result, in order. Raises RunFailed if it fails."""
    completed = subprocess.run(
        [sys.executable, "-m", "mgpu_env.bench.worker",
         json.dumps([dataclasses.asdict(spec) for spec in group])],
        # The points of a group differ only in their data: one environment serves them all.
        env=child_environment(group[0], os.environ), capture_output=True, text=True,
        timeout=timeout_s, check=False,
    )
    result = parse_child_output(completed.stdout)
    if result is not None and "error" in result:
        raise RunFailed(f"{describe_group(group)}: {result['error']}")
    if completed.returncode != 0 or result is None or len(result["points"]) != len(group):
        tail = "\n    ".join((completed.stderr or completed.stdout).strip().splitlines()[-6:])
        raise RunFailed(
            f"{describe_group(group)} failed with exit code {completed.returncode}:\n"
            f"    {tail}"
        )
    points: list[dict[str, Any]] = result["points"]
    return points


# ------------------------------------------------------------------------------ the sweep


def _measure_groups(
    groups: list[Group], runner: ChildRunner,
    on_point: Callable[[dict[str, Any], int, int], None] | None,
) -> dict[PointSpec, dict[str, Any]]:
    """Each group in a child process of its own; each point's record, as it comes."""
    measured: dict[PointSpec, dict[str, Any]] = {}
    total, done = sum(len(group) for group in groups), 0
    for child, group in enumerate(groups):
        for spec, record in zip(group, _measure(group, runner), strict=True):
            record["child"] = child
            measured[spec] = record
            done += 1
            if on_point:
                on_point(record, done, total)
    return measured


def run_bench(
    runtime: Runtime,
    *,
    environ: Mapping[str, str] | None = None,
    runner: ChildRunner | None = None,
    on_point: Callable[[dict[str, Any], int, int], None] | None = None,
    profile_root: Path | None = None,
) -> BenchResults:
    """Run the sweep (and the seed comparison if BENCH_COMPARE) and return the results.

    A point whose child fails is recorded with its error and the sweep goes on; the caller
    decides the exit code from `results.failed`. Raises ConfigError for an impossible plan.
    BENCH_EXPLAIN profiles each point into a folder under `profile_root` (else a temporary one).
    """
    environ = os.environ if environ is None else environ
    settings = runtime.settings
    if ":" in settings.model:
        # A builder that cannot be imported is a bad setting (exit 2), found before any
        # child starts rather than as a failure of every point.
        from mgpu_env.training.step import user_code

        user_code.import_hook(settings.model, "MODEL", user_code.MODEL_CONTRACT)
    if runner is None:
        def runner(group: Group) -> list[dict[str, Any]]:
            # BENCH_TIMEOUT is each point's: a child measuring three variants gets three.
            return run_child(group, timeout_s=settings.bench_timeout * len(group))
    devices, specs = plan_bench(runtime, environ, profile_root)
    keep = specs[0].keep_bytes  # training's keep limit, the same for every point
    comparison = None
    if settings.bench_compare:
        seed_spec, mgpu_spec = (dataclasses.replace(spec, keep_bytes=keep) for spec in
                                attach_executions(comparison_points(settings, devices),
                                                  devices, runtime))
        comparison = (seed_spec, mgpu_spec)
    results = BenchResults(
        settings=settings.describe(),
        devices=devices,
        method=dict(METHOD, warmup_steps=settings.bench_warmup,
                    steps_per_interval=settings.bench_steps,
                    intervals=settings.bench_intervals),
        notes=list(devices.notes),
    )
    groups = group_points(specs)
    if comparison is not None:
        # The seed runs first; its mgpu twin is reused from the sweep when it is there.
        groups.insert(0, (comparison[0],))
        if comparison[1] not in specs:
            groups.insert(1, (comparison[1],))
    measured = _measure_groups(groups, runner, on_point)
    results.points.extend(measured[spec] for spec in specs)
    add_efficiencies(results.points)
    if settings.bench_explain:
        explain_points(results.points, _link_class(runtime))
    results.notes.extend(chunk_notes(results.points))
    if comparison is not None:
        seed_spec, mgpu_spec = comparison
        seed, twin = measured[seed_spec], measured[mgpu_spec]
        results.seed_comparison = seed_comparison(seed, twin)
    return results


def plan_bench(
    runtime: Runtime, environ: Mapping[str, str] | None = None,
    profile_root: Path | None = None,
) -> tuple[DevicePlan, list[PointSpec]]:
    """The sweep's devices and its points, each with the runtime's decisions for its
    child (what `mgpu bench --dry-run` shows); nothing is measured, TensorFlow is not
    imported. Raises ConfigError (exit 2) for a sweep these devices cannot run."""
    environ = os.environ if environ is None else environ
    devices = plan_devices(runtime.settings, runtime.selection, environ)
    return devices, _planned_points(runtime, devices, profile_root, _keep_bytes(runtime))


def plan_as_dict(runtime: Runtime, devices: DevicePlan, specs: list[PointSpec]
                 ) -> dict[str, Any]:
    """`mgpu bench --dry-run --json`: the runtime's decisions (`"decisions"`, as the doctor
    and `mgpu train --dry-run --json` state them), the devices swept, and each point with
    the devices, precision and Keras its child is given."""
    points = []
    for spec in specs:
        execution = Execution.from_json(spec.execution)
        points.append({
            "replicas": spec.replicas, "variant": spec.variant, "data": spec.data,
            "global_batch": spec.global_batch, "device_type": execution.split.device_type,
            "devices": list(execution.split.names),
            "cuda_visible_devices": spec.cuda_visible_devices,
            "precision": execution.precision.policy, "keras": execution.keras.version,
        })
    return {"decisions": runtime.decided(), "devices": dataclasses.asdict(devices),
            "points": points}


def _keep_bytes(runtime: Runtime) -> int:
    """Training's keep limit on this machine, decided once for every point (`plan_keep`,
    as `mgpu train` decides it): a point reads DATASET's files whole only under it."""
    from mgpu_env.training.run.plan import plan_keep

    return plan_keep(runtime, workers=1).bytes


def _planned_points(runtime: Runtime, devices: DevicePlan, profile_root: Path | None,
                    keep_bytes: int) -> list[PointSpec]:
    """The sweep's points with their executions, training's keep limit, and their profile
    folders (BENCH_EXPLAIN)."""
    settings = runtime.settings
    specs = [dataclasses.replace(spec, keep_bytes=keep_bytes) for spec in attach_executions(
        plan_points(settings, devices, runtime.precision),
        devices, runtime,
    )]
    return with_profile_dirs(specs, profile_root) if settings.bench_explain else specs


def _link_class(runtime: Runtime) -> tuple[float, str] | None:
    """What the selected GPUs' slowest link carries (NVML): the all-reduce's bandwidth
    where the doctor's sweep measured none."""
    return links.expected_bandwidth(runtime.selection.gpus, runtime.nvml.links)


def with_profile_dirs(specs: list[PointSpec], root: Path | None) -> list[PointSpec]:
    """Each point with the log folder its child profiles it into: `<root>/<n>x-<variant>`,
    one TensorBoard run per point (`tensorboard --logdir <root>`)."""
    import tempfile

    root = root if root is not None else Path(tempfile.mkdtemp(prefix="mgpu-bench-profile-"))
    return [dataclasses.replace(spec, profile_dir=str(root / f"{spec.replicas}x-{spec.variant}"))
            for spec in specs]


def _measure(group: Group, runner: ChildRunner) -> list[dict[str, Any]]:
    """Each point's record; every point of a group whose child failed has its error."""
    try:
        children = runner(group)
    except RunFailed as err:
        children = [{"error": str(err)}] * len(group)
    except subprocess.TimeoutExpired as err:
        children = [{"error": f"timed out after {err.timeout:.0f} s"}] * len(group)
    return [point_record(spec, child) for spec, child in zip(group, children, strict=True)]
