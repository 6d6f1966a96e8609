"""Bench without TensorFlow: settings from text, and a runner with canned timings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mgpu_env.bench.input_alone import KEPT_REASON
from mgpu_env.bench.sweep import Group, PointSpec
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.config.settings import Settings


def settings(**values: str) -> Settings:
    return resolve_settings(values, {}).settings


LOAD = (1.0, 0.98, 1.02, 1.0)  # the machine's load in each round: slows every variant alike


def fake_runner(
    base_step_s: float = 0.01, efficiency: float = 0.9, seed_slowdown: float = 3.0,
    real_slowdown: float = 1.25, stream_slowdown: float = 1.5, stream_alone: float = 8000.0,
) -> Callable[[Group], list[dict[str, Any]]]:
    """Timings of a device where each extra replica costs (1 - efficiency) of a step; the
    stream gives `stream_alone` samples/s with no step (the synthetic step takes 6,400 at
    1 replica of batch 64, 11,520 at 2)."""

    def one(spec: PointSpec) -> dict[str, Any]:
        # weak scaling: n replicas take base / efficiency(n) per step of n x batch
        step = base_step_s if spec.replicas == 1 else base_step_s / efficiency
        if spec.runner == "seed":
            step *= seed_slowdown
        if spec.data == "real":
            step *= real_slowdown
        if spec.data == "stream":
            step *= stream_slowdown
        interval = step * spec.steps_per_interval
        result: dict[str, Any] = {
            "interval_seconds": [interval * f for f in LOAD][: spec.intervals],
            "device_type": "CPU",
            "devices": [f"/device:CPU:{i}" for i in range(spec.replicas)],
            "logical_devices": spec.virtual_devices > 0,
            "parameters": 55050,
        }
        if spec.data == "real":
            result["input_alone"] = {"samples_per_s": None, "skipped": KEPT_REASON}
        if spec.data == "stream":
            result["input_alone"] = {"samples_per_s": stream_alone, "samples": 64_000,
                                     "elements": 40, "seconds": 64_000 / stream_alone}
            result["steps_per_chunk"] = 83
        return result

    def run(group: Group, timeout_s: float | None = None) -> list[dict[str, Any]]:
        return [one(spec) for spec in group]

    return run
