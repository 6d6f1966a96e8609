"""`mgpu bench`'s results, as bench.json records them.

`mgpu bench`'s results: each point's record, the efficiencies, the input pipeline's cost, the
seed comparison, and bench.json."""

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
# 3: with --explain, the profile's reading of the input's cost comes from traced intervals of
# the timed feed itself (`profiled_input_cost`, `profiled_pipeline`, `profiled_from`).
SCHEMA_VERSION = 3
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
        profiled = profiled_input(twin, real)
        if profiled is not None:
            costs[-1].update(profiled)
            costs[-1]["readings_apart"] = abs(lost.median - profiled["profiled_input_cost"])
        # The pipeline's cores cost the step only where it computes on them.
        on_host = real["worker"].get("device_type") == "CPU"
        costs[-1]["input_cost_kind"] = input_cost_kind(
            lost.median, (profiled or {}).get("profiled_input_wait"),
            costs[-1].get("cpu_throughput_lost"),
            (profiled or {}).get("profiled_pipeline") if on_host else None)
    return costs


# Two readings of one cost agree when they are this close (fractions of throughput): the
# spread two runs of the same point show on a quiet 2-core machine.
READINGS_AGREE = 0.05


def input_cost_kind(lost: float, wait: float | None, cpu_lost: float | None,
                    pipeline: float | None = None) -> str | None:
    """Where the input's cost goes, told by which direct reading accounts, within
    READINGS_AGREE, for what the wall clock lost (`lost`):

    - "waiting": the profile's reading, mostly the steps' wait for their input (`wait`): a
      GPU's step starved by a pipeline that cannot keep up;
    - "cpu": the profile's reading, mostly the share of the cores tf.data's threads took
      (`pipeline`, given where the step computes on those cores: CPU devices); or, with no
      profile of the pipeline, the extra CPU per sample (`cpu_lost`), which cannot tell the
      pipeline's threads from the step's;
    - "step": the extra CPU per sample accounts for it, but the profile's pipeline and wait
      do not: the step itself takes more per sample on this data than on synthetic's one
      batch (the feed's ops inside the step, rows read from memory, not from the cache);
    - "none": nothing lost and nothing read beyond the readings' agreement;
    - "unexplained": no reading accounts for it.

    None without a direct reading (no profile and no CPU clock)."""
    if wait is None and cpu_lost is None and pipeline is None:
        return None
    # The profile's reading: the wait, plus the pipeline's cores where the step computes on
    # them (`pipeline` is given then); its larger part names the kind.
    read = None if wait is None and pipeline is None else (wait or 0.0) + (pipeline or 0.0)
    if abs(lost) < READINGS_AGREE and (read or 0.0) < READINGS_AGREE:
        return "none"
    if lost < 0:  # the data's run faster than synthetic's: a gain no input cost explains
        return "unexplained"
    if read is not None and abs(lost - read) <= READINGS_AGREE:
        return "waiting" if (wait or 0.0) >= (pipeline or 0.0) else "cpu"
    if cpu_lost is not None and abs(lost - cpu_lost) <= READINGS_AGREE:
        return "cpu" if pipeline is None else "step"
    return "unexplained"


def profiled_input(twin: Mapping[str, Any], real: Mapping[str, Any]) -> dict[str, Any] | None:
    """The second reading of a data point's input cost, where `--explain` profiled both it
    and its synthetic twin, beyond the twin's: `profiled_input_wait` (the share its steps
    waited for input), `profiled_pipeline` (the share of the cores tf.data's pipeline
    threads took; counted in the cost only where the step computes on those cores, CPU
    devices) and `profiled_input_cost`, their sum there, the wait elsewhere.

    Read from traced intervals of the timed feed itself (`explain.trace_intervals`), so the
    two readings are of one feed; where that trace could not be read (its `error`), the
    per-step split's input share stands in (`profile.steps`: another feed, no pipeline
    reading), as `profiled_from` says.
    None without both profiles."""
    timed = [(p.get("explain") or {}).get("timed_feed_input") or {} for p in (twin, real)]
    if all("cost_share" in t for t in timed):
        base, data = timed

        def beyond(key: str) -> float:
            return max(0.0, float(data[key]) - float(base[key]))

        return {"profiled_input_cost": beyond("cost_share"),
                "profiled_input_wait": beyond("wait_share"),
                "profiled_pipeline": beyond("pipeline_share"),
                "profiled_from": f"{data['traced']} traced intervals of the timed feed"}
    shares = [(p.get("explain") or {}).get("split", {}).get("share", {}).get("input")
              for p in (twin, real)]
    if any(share is None for share in shares):
        return None
    wait = max(0.0, float(shares[1]) - float(shares[0]))
    return {"profiled_input_cost": wait, "profiled_input_wait": wait,
            "profiled_from": "the per-step split (another feed: a per-step iterator)"}


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


