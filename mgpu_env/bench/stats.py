"""The arithmetic of `mgpu bench`: pure functions over timed intervals, tested on known inputs.

Weak scaling, as the seed advises: the global batch is the per-replica batch times the
replicas, so n replicas do n times the work per step, and perfect scaling means n times
the samples per second. efficiency(n) = throughput(n) / (n x throughput(1)).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any


def t95(degrees_of_freedom: int) -> float:
    """The two-sided 95% quantile of Student's t (SciPy's), for a mean's confidence interval."""
    if degrees_of_freedom < 1:
        raise ValueError(f"degrees of freedom must be 1 or more, got {degrees_of_freedom}")
    from scipy import stats

    return float(stats.t.ppf(0.975, degrees_of_freedom))


@dataclass(frozen=True)
class Spread:
    """Summary of repeated measurements: median, quartiles, extremes, mean and its 95% CI."""

    median: float
    q1: float
    q3: float
    minimum: float
    maximum: float
    mean: float
    ci95: float  # half-width of the 95% confidence interval of the mean
    count: int

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def as_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "iqr": self.iqr}


def spread(values: Sequence[float]) -> Spread:
    """Median, quartiles (inclusive method), min, max, mean and 95% CI of `values` (2 or more)."""
    if len(values) < 2:
        raise ValueError(f"need at least 2 measurements for a spread, got {len(values)}")
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    mean = statistics.fmean(values)
    ci95 = t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Spread(
        median=statistics.median(values), q1=q1, q3=q3, minimum=min(values),
        maximum=max(values), mean=mean, ci95=ci95, count=len(values),
    )


def interval_throughputs(
    interval_seconds: Sequence[float], steps_per_interval: int, global_batch: int
) -> list[float]:
    """Samples per second of each timed interval of `steps_per_interval` steps."""
    bad = [s for s in interval_seconds if not s > 0]
    if bad:
        raise ValueError(f"interval durations must be positive, got {bad[0]}")
    return [steps_per_interval * global_batch / seconds for seconds in interval_seconds]


def scaling_efficiency(
    throughput: float, replicas: int, base_throughput: float, base_replicas: int = 1
) -> float:
    """Throughput against perfect linear scaling from the base point: 1.0 is ideal.

    efficiency = (throughput / replicas) / (base_throughput / base_replicas), which is
    throughput(n) / (n x throughput(1)) when the base is one replica.
    """
    if replicas < 1 or base_replicas < 1:
        raise ValueError("replica counts must be 1 or more")
    if base_throughput <= 0:
        raise ValueError(f"the base throughput must be positive, got {base_throughput}")
    return (throughput / replicas) / (base_throughput / base_replicas)


def efficiencies(throughput_by_replicas: Mapping[int, float]) -> dict[int, float]:
    """Efficiency of every point against the point with the fewest replicas (ideally 1)."""
    if not throughput_by_replicas:
        return {}
    base = min(throughput_by_replicas)
    base_throughput = throughput_by_replicas[base]
    return {
        n: scaling_efficiency(t, n, base_throughput, base)
        for n, t in sorted(throughput_by_replicas.items())
    }


def input_pipeline_cost(synthetic_throughput: float, real_throughput: float) -> float:
    """Share of synthetic-data throughput lost when the real input pipeline feeds the step.

    0.25 means the real pipeline runs at 75% of the speed of data already on the device;
    a negative value means no measurable cost (noise).
    """
    if synthetic_throughput <= 0:
        raise ValueError(f"the synthetic throughput must be positive, got {synthetic_throughput}")
    return 1.0 - real_throughput / synthetic_throughput


def median_ci95(summary: Spread) -> float:
    """Half-width of the ~95% confidence interval of a median: 1.58 x IQR / sqrt(n), the
    notches of a box plot (McGill, Tukey and Larsen, 1978). How far the median of another
    run of as many rounds may well land."""
    return 1.58 * summary.iqr / math.sqrt(summary.count)


def round_costs(
    synthetic_seconds: Sequence[float], data_seconds: Sequence[float]
) -> list[float]:
    """`input_pipeline_cost` of each round, from the two intervals of that round (same
    steps, same global batch): 1 - synthetic's time / the data's time."""
    if len(synthetic_seconds) != len(data_seconds):
        raise ValueError(f"rounds pair one interval of each: got {len(synthetic_seconds)} "
                         f"synthetic and {len(data_seconds)} data intervals")
    return [
        input_pipeline_cost(1.0 / synthetic, 1.0 / data)
        for synthetic, data in zip(synthetic_seconds, data_seconds, strict=True)
    ]


def summarize_point(
    interval_seconds: Sequence[float], steps_per_interval: int, global_batch: int, replicas: int
) -> dict[str, Any]:
    """Throughput (samples/s), per-replica throughput and step time of one sweep point."""
    throughputs = interval_throughputs(interval_seconds, steps_per_interval, global_batch)
    samples = spread(throughputs)
    step_ms = spread([1000.0 * s / steps_per_interval for s in interval_seconds])
    return {
        "samples_per_s": samples.as_dict(),
        "samples_per_s_per_replica": samples.median / replicas,
        "step_time_ms": step_ms.as_dict(),
    }
