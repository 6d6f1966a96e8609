"""The arithmetic of `mgpu bench` on known inputs: spread, throughput, efficiency, cost."""

from __future__ import annotations

import math

import pytest

from mgpu_env.bench.stats import (
    efficiencies,
    input_pipeline_cost,
    interval_throughputs,
    round_costs,
    scaling_efficiency,
    spread,
    summarize_point,
    t95,
)
from mgpu_env.bench.sweep import power_of_two_counts


def test_spread_of_one_to_five() -> None:
    result = spread([5.0, 1.0, 4.0, 2.0, 3.0])
    assert result.median == 3.0
    assert (result.q1, result.q3, result.iqr) == (2.0, 4.0, 2.0)
    assert (result.minimum, result.maximum, result.mean) == (1.0, 5.0, 3.0)
    # t(0.975, 4 df) = 2.776 (3 decimals); stdev of 1..5 = sqrt(2.5)
    assert result.ci95 == pytest.approx(2.776 * math.sqrt(2.5) / math.sqrt(5), rel=1e-3)
    assert result.count == 5
    assert result.as_dict()["iqr"] == 2.0


def test_spread_needs_two_values() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        spread([1.0])


def test_t95_is_students_t_quantile() -> None:
    # The printed tables' values, to their three decimals; large samples near the normal 1.96.
    assert round(t95(1), 3) == 12.706
    assert round(t95(9), 3) == 2.262
    assert 1.96 < t95(200) < 1.975
    with pytest.raises(ValueError):
        t95(0)


def test_interval_throughputs() -> None:
    # 10 steps of 64 samples in 0.5 s and in 1 s
    assert interval_throughputs([0.5, 1.0], 10, 64) == [1280.0, 640.0]
    with pytest.raises(ValueError, match="positive"):
        interval_throughputs([0.0], 10, 64)


def test_efficiency_against_one_replica() -> None:
    assert scaling_efficiency(180.0, 2, 100.0) == pytest.approx(0.9)
    assert efficiencies({1: 100.0, 2: 180.0, 4: 320.0}) == pytest.approx(
        {1: 1.0, 2: 0.9, 4: 0.8}
    )
    # perfect and super-linear scaling
    assert efficiencies({1: 50.0, 8: 400.0})[8] == pytest.approx(1.0)
    assert efficiencies({1: 50.0, 2: 110.0})[2] == pytest.approx(1.1)


def test_efficiency_against_the_fewest_replicas_when_one_is_missing() -> None:
    assert efficiencies({4: 360.0, 2: 200.0}) == pytest.approx({2: 1.0, 4: 0.9})
    assert efficiencies({}) == {}


def test_efficiency_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        scaling_efficiency(1.0, 0, 1.0)
    with pytest.raises(ValueError):
        scaling_efficiency(1.0, 2, 0.0)


def test_input_pipeline_cost() -> None:
    assert input_pipeline_cost(100.0, 75.0) == pytest.approx(0.25)
    assert input_pipeline_cost(100.0, 100.0) == 0.0
    with pytest.raises(ValueError):
        input_pipeline_cost(0.0, 1.0)


def test_round_costs_pair_the_intervals_of_each_round() -> None:
    # Round 2 ran under twice the load for both: its cost is the same as round 1's.
    assert round_costs([1.0, 2.0, 1.0], [1.25, 2.5, 1.0]) == pytest.approx([0.2, 0.2, 0.0])
    with pytest.raises(ValueError, match="rounds pair"):
        round_costs([1.0, 2.0], [1.0])


def test_summarize_point() -> None:
    # 2 replicas x 32 = 64 samples per step, 10 steps per interval
    summary = summarize_point([0.5, 1.0, 0.5], steps_per_interval=10, global_batch=64,
                              replicas=2)
    assert summary["samples_per_s"]["median"] == 1280.0
    assert summary["samples_per_s_per_replica"] == 640.0
    assert summary["step_time_ms"]["median"] == 50.0


@pytest.mark.parametrize(
    ("maximum", "counts"),
    [(1, (1,)), (2, (1, 2)), (4, (1, 2, 4)), (6, (1, 2, 4, 6)), (8, (1, 2, 4, 8))],
)
def test_power_of_two_counts(maximum: int, counts: tuple[int, ...]) -> None:
    assert power_of_two_counts(maximum) == counts
