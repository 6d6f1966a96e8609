"""`mgpu bench`'s results: each point's record, the efficiencies, the input pipeline's cost,
the seed comparison, and bench.json."""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mgpu_env.bench.plan import DevicePlan, PointSpec
from mgpu_env.bench.stats import (
    efficiencies,
    interval_throughputs,
    median_ci95,
    round_costs,
    spread,
    summarize_point,
)
from mgpu_env.training.run import rundir

BENCH_JSON = "bench.json"
# 2: the input's cost is paired round by round (`throughput_lost` is the median over rounds,
# `significant` its confidence interval clear of 0); points record their child, their
# intervals' starts and what their stream gives alone (`input_alone`).
SCHEMA_VERSION = 2
# Rounds from which a median's notch (`stats.median_ci95`) alone says whether a cost is noise.
NOTCH_ROUNDS = 6
# A point record's keys taken from its child's result (the rest is under "worker").
POINT_KEYS = ("interval_seconds", "interval_starts", "interval_cpu_seconds", "measured_with",
              "input_alone", "explain")


@dataclass
class BenchResults:
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
            "input_alone": input_alone_verdicts(self.points),
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
        "steps_per_interval": spec.steps_per_interval,
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
    # The interval printed beside the median is the median's own (a box plot's notch), not
    # the mean's `ci95`, which bench.json keeps for its readers.
    record["samples_per_s"]["median_ci95"] = median_ci95(spread(interval_throughputs(
        child["interval_seconds"], spec.steps_per_interval, spec.global_batch)))
    record.update({k: child[k] for k in POINT_KEYS if k in child})
    record["worker"] = {k: v for k, v in child.items() if k not in POINT_KEYS}
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


def _twin_key(point: Mapping[str, Any]) -> tuple[Any, ...]:
    return point["replicas"], point["mixed_precision"], point["xla"], point["runner"]


def _synthetic_twins(points: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {
        _twin_key(p): p for p in points if p["data"] == "synthetic" and not p.get("error")
    }


def input_costs(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each real- or stream-data point measured in one child with its synthetic twin:
    the share of throughput its input path costs, round by round (the two intervals of a
    round shared the machine's load), and the median and spread over the rounds."""
    synthetic = _synthetic_twins(points)
    costs = []
    for real in points:
        if real["data"] == "synthetic" or real.get("error"):
            continue
        twin = synthetic.get(_twin_key(real))
        if twin is None or twin.get("child") != real.get("child"):
            continue
        rounds = round_costs(twin["interval_seconds"], real["interval_seconds"])
        lost = spread(rounds)
        ci95 = median_ci95(lost)
        added_ms = [
            1000.0 * (d - s) / real["steps_per_interval"]
            for s, d in zip(twin["interval_seconds"], real["interval_seconds"], strict=True)
        ]
        costs.append({
            "replicas": real["replicas"],
            "data": real["data"],
            "variant": real["variant"],
            "precision": real["precision"],
            "xla": real["xla"],
            "synthetic_samples_per_s": twin["samples_per_s"]["median"],
            "real_samples_per_s": real["samples_per_s"]["median"],
            "throughput_lost": lost.median,
            "throughput_lost_ci95": ci95,
            "throughput_lost_rounds": rounds,
            "throughput_lost_spread": {k: v for k, v in lost.as_dict().items()
                                       if k not in ("mean", "ci95", "count")},
            "step_time_added_ms": statistics.median(added_ms),
            # The median's confidence interval leaves out 0: not just noise. A notch of
            # fewer rounds is too narrow to trust alone: every round must agree too.
            "significant": abs(lost.median) > ci95 and (
                lost.count >= NOTCH_ROUNDS or lost.minimum > 0 or lost.maximum < 0),
        })
        cpu_synthetic = twin.get("interval_cpu_seconds")
        cpu_real = real.get("interval_cpu_seconds")
        if real["worker"].get("device_type") == "CPU" and cpu_synthetic and cpu_real:
            # On CPU devices the same per CPU second of this process (all its threads):
            # a second view, beside the wall clock's, of what the input adds to the work.
            costs[-1]["cpu_throughput_lost"] = statistics.median(
                round_costs(cpu_synthetic, cpu_real))
        wait = profiled_input_wait(twin, real)
        if wait is not None:
            costs[-1]["profiled_input_wait"] = wait
            costs[-1]["readings_apart"] = abs(lost.median - wait)
        costs[-1]["input_cost_kind"] = input_cost_kind(
            lost.median, wait, costs[-1].get("cpu_throughput_lost"))
    return costs


# Two readings of one cost agree when they are this close (fractions of throughput): the
# spread two runs of the same point show on a quiet 2-core machine.
READINGS_AGREE = 0.05


def input_cost_kind(lost: float, wait: float | None, cpu_lost: float | None) -> str | None:
    """How the input costs the step what the wall clock lost (`lost`), told by which direct
    reading accounts for it: "waiting" (the profiled step waits for its input: what a GPU's
    step shows when the pipeline cannot keep up), "cpu" (the step hardly waits, but the
    input's threads take CPU the step computes with: the extra CPU per sample `cpu_lost`
    matches; where the step itself runs on the host's cores, as on CPU devices, this is how
    an input costs), "none" (nothing lost beyond the readings' agreement), "unexplained"
    (neither reading accounts for it: something else slows the real data's step). None
    without a direct reading (no profile and no CPU clock)."""
    if wait is None and cpu_lost is None:
        return None
    if abs(lost) < READINGS_AGREE and (wait is None or wait < READINGS_AGREE):
        return "none"
    if wait is not None and abs(lost - wait) <= READINGS_AGREE:
        return "waiting"
    if cpu_lost is not None and abs(lost - cpu_lost) <= READINGS_AGREE:
        return "cpu"
    return "unexplained"


def profiled_input_wait(twin: Mapping[str, Any], real: Mapping[str, Any]) -> float | None:
    """The second reading of a data point's input cost, where `--explain` profiled both it
    and its synthetic twin: the share of the step TensorFlow's profiler counted as input
    (waiting for it, and copying it to the device), beyond its twin's. None without both
    splits. It is read from the explain's own per-step iterator (`profile.steps`), not from the
    timed intervals' feed: where the two readings part, the feed costs the step other than
    by making it wait (on a machine of few cores: its threads' CPU)."""
    shares = [(p.get("explain") or {}).get("split", {}).get("share", {}).get("input")
              for p in (twin, real)]
    if any(share is None for share in shares):
        return None
    return max(0.0, float(shares[1]) - float(shares[0]))


def input_alone_verdicts(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per data variant: what its input gave alone at each replica count against what the
    step takes there (the synthetic twin's samples/s: the step with its input free; the
    point's own without a twin), and from which replica count, if any, the input limits."""
    synthetic = _synthetic_twins(points)
    series: dict[str, list[dict[str, Any]]] = {}
    for point in points:
        if point["data"] != "synthetic" and not point.get("error") and "input_alone" in point:
            series.setdefault(point["variant"], []).append(point)
    verdicts = []
    for variant, measured in series.items():
        measured = sorted(measured, key=lambda p: p["replicas"])
        first = measured[0]
        verdict: dict[str, Any] = {"variant": variant, "data": first["data"],
                                   "precision": first["precision"], "xla": first["xla"]}
        alone = [p for p in measured if p["input_alone"].get("samples_per_s")]
        if not alone:
            verdict.update(measured=False, skipped=first["input_alone"].get("skipped"))
            verdicts.append(verdict)
            continue
        rows = []
        for point in alone:
            twin = synthetic.get(_twin_key(point))
            step = (twin or point)["samples_per_s"]["median"]
            given = point["input_alone"]["samples_per_s"]
            rows.append({"replicas": point["replicas"], "input_alone_samples_per_s": given,
                         "step_samples_per_s": step,
                         "step_from": "synthetic" if twin else "this point",
                         "keeps_up": given >= step})
        short = [row["replicas"] for row in rows if not row["keeps_up"]]
        verdict.update(measured=True, by_replicas=rows, keeps_up=not short,
                       limits_from=short[0] if short else None)
        verdicts.append(verdict)
    return verdicts


def chunk_notes(points: list[dict[str, Any]]) -> list[str]:
    """A note when a stream's chunks do not divide the timed intervals: some intervals then
    take a new chunk and some none, and the median over rounds falls between them. (Digits,
    the MLP, chunks of 83 steps, 1 replica, 40 rounds of 50 steps: 1.0% lost in the rounds
    whose stream interval took no chunk, 9.6% in those that took one, 4.1% overall; 11.7%
    in 40 rounds of 83 steps.)"""
    notes = []
    for chunk, steps in sorted({
        (p["worker"]["steps_per_chunk"], p["steps_per_interval"])
        for p in points if not p.get("error") and "steps_per_chunk" in p.get("worker", {})
    }):
        if steps % chunk:
            fit = chunk * -(-steps // chunk)
            notes.append(
                f"the stream feeds the step chunks of {chunk} steps; BENCH_STEPS={steps} is "
                f"not a multiple of {chunk}, so some intervals take a new chunk and some "
                f"none, and the stream's cost moves from run to run: BENCH_STEPS={fit} (or "
                "another multiple) steadies it"
            )
    return notes


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


def write_results(results: BenchResults, output_dir: Path) -> Path:
    """Write bench.json under `output_dir` (created) and return its path."""
    # Atomic, like the run folder's files: a kill mid-write leaves the earlier bench.json.
    path = output_dir / BENCH_JSON
    rundir.atomic_write_json(path, results.as_dict())
    return path


