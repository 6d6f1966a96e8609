"""`mgpu bench`'s report: each point's record, the efficiencies, the input pipeline's cost,
the seed comparison, and bench.json."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mgpu_env.bench.plan import DevicePlan, PointSpec
from mgpu_env.bench.stats import efficiencies, input_pipeline_cost, summarize_point
from mgpu_env.training import rundir

BENCH_JSON = "bench.json"
SCHEMA_VERSION = 1


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
            "schema_version": SCHEMA_VERSION,
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


