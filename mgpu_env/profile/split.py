"""The step-time split of TensorFlow's profiler, read from its own converter.

The step-time split of TensorFlow's profiler: its overview page's per-step breakdown
(`GenericStepTimeBreakdown`, the input pipeline analyzer's step-time graph), read from the
profile plugin's own converter (`xprof`), not timed by hand.

The converter gives one row per profiled step with its time in each category; they add up to
the step's time (the step marker's span), which `StepSplit.unaccounted_ms` checks. xprof's
JSON merges the input's two parts (the host waiting for input, and the host-to-device copy)
into one figure, `input`.

On CPU devices (logical or not) the profiler has no device plane: every op is "host compute"
(the all-reduce between logical CPU devices too), so the device categories stay 0 there.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# (our key, the converter's column id, what the overview page calls it), in its order.
CATEGORIES: tuple[tuple[str, str, str], ...] = (
    ("compilation", "compileTimeMs", "compilation"),
    ("input", "infeedTimeMs", "input (host wait + host to device)"),
    ("device_compute", "deviceComputeTimeMs", "device compute"),
    ("device_to_device", "deviceToDeviceTimeMs", "device to device"),
    ("collectives", "deviceCollectivesTimeMs", "device collectives"),
    ("kernel_launch", "kernelLaunchTimeMs", "kernel launch"),
    ("host_compute", "hostComputeTimeMs", "host compute"),
    ("output", "outfeedTimeMs", "output (device to host)"),
    ("other", "otherTimeMs", "all others"),
)
CATEGORY_KEYS: tuple[str, ...] = tuple(key for key, _, _ in CATEGORIES)
# What moves data between the devices: the all-reduce's NCCL kernels and device copies.
COLLECTIVES_KEYS: tuple[str, ...] = ("collectives", "device_to_device")
STEP_TIME_COLUMN = "stepTimeMs"
# The converter's step-time graph: the second table of the input pipeline analyzer's JSON.
TOOL = "input_pipeline_analyzer"
# The categories add up to the step time within this (ms per step, or share of it): the
# converter rounds nothing, so a larger gap means a row was read wrongly.
SUM_TOLERANCE_MS = 0.01
SUM_TOLERANCE_SHARE = 0.001


class NoSteps(ValueError):
    """The trace holds no step the profiler could find (its reason in the message)."""


@dataclass(frozen=True)
class StepSplit:
    """Mean milliseconds per profiled step in each category, and the step time."""

    step_ms: float
    ms: dict[str, float]
    steps: int
    hardware: str  # the converter's hardware type: CPU_ONLY, GPU, TPU
    per_step: list[dict[str, float]] = field(default_factory=list)

    @property
    def typical_step_ms(self) -> float:
        """The median step's time: a step the machine's other work interrupted moves the
        mean, not this."""
        if not self.per_step:
            return self.step_ms
        return statistics.median(step["step_ms"] for step in self.per_step)

    @property
    def unaccounted_ms(self) -> float:
        """Step time the categories leave out (0 within the converter's rounding)."""
        return self.step_ms - sum(self.ms.values())

    def share(self, *keys: str) -> float:
        """The share of the step time in these categories (0 to 1)."""
        if self.step_ms <= 0:
            return 0.0
        return sum(self.ms[key] for key in keys) / self.step_ms

    def middle(self, steps: int) -> StepSplit:
        """The split of the `steps` steps in the middle of those converted (the traced
        edges, one more each side, leave out the start and the stop of the profiler)."""
        if self.steps <= steps:
            return self
        first = (self.steps - steps) // 2
        return _from_steps(self.per_step[first:first + steps], self.hardware)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepSplit:
        """The split `as_dict` wrote (bench.json, a child's result)."""
        return cls(float(data["step_ms"]), {k: float(data["ms"][k]) for k in CATEGORY_KEYS},
                   int(data["steps"]), str(data.get("hardware", "")),
                   list(data.get("per_step", ())))

    def as_dict(self) -> dict[str, Any]:
        return {
            "step_ms": self.step_ms,
            "ms": dict(self.ms),
            "share": {key: self.share(key) for key in CATEGORY_KEYS},
            "steps": self.steps,
            "hardware": self.hardware,
            "unaccounted_ms": self.unaccounted_ms,
            "per_step": self.per_step,
            "source": "TensorFlow's profiler, converted by xprof (input_pipeline_analyzer's "
                      "step-time graph, the overview page's GenericStepTimeBreakdown)",
        }


def split_from_tool_json(data: bytes | str) -> StepSplit:
    """The split from the converter's `input_pipeline_analyzer` JSON (a list of gviz
    tables: the second is the step-time graph, one row per step). Raises NoSteps with the
    converter's own reason when it found no step."""
    tables = json.loads(data)
    graph = tables[1] if isinstance(tables, list) and len(tables) > 1 else {}
    columns = [column["id"] for column in graph.get("cols", ())]
    properties: Mapping[str, str] = graph.get("p", {})
    rows = [_row(columns, row) for row in graph.get("rows", ())]
    if not rows:
        reason = properties.get("input_conclusion") or "the converter returned no step"
        raise NoSteps(reason)
    per_step = [
        {**{key: row[column] for key, column, _ in CATEGORIES},
         "step_ms": row[STEP_TIME_COLUMN]}
        for row in rows
    ]
    return _from_steps(per_step, properties.get("hardware_type", ""))


def _from_steps(per_step: list[dict[str, float]], hardware: str) -> StepSplit:
    """The mean over these steps of each category and of the step time."""
    return StepSplit(
        step_ms=statistics.fmean(step["step_ms"] for step in per_step),
        ms={key: statistics.fmean(step[key] for step in per_step) for key in CATEGORY_KEYS},
        steps=len(per_step),
        hardware=hardware,
        per_step=per_step,
    )


def _row(columns: Sequence[str], row: Mapping[str, Any]) -> dict[str, float]:
    """One gviz row as {column id: milliseconds}, numeric columns only."""
    cells = [cell.get("v") if cell else None for cell in row.get("c", ())]
    return {
        column: float(value) for column, value in zip(columns, cells, strict=False)
        if isinstance(value, int | float)
    }


def xspace_files(logdir: Path) -> list[Path]:
    """The newest profile session's XSpace files under a TensorBoard log folder (one per
    host): TensorFlow writes `plugins/profile/<timestamp>/<host>.xplane.pb`."""
    sessions = sorted((logdir / "plugins" / "profile").glob("*/"))
    if not sessions:
        return []
    return sorted(sessions[-1].glob("*.xplane.pb"))


def convert(xspaces: Sequence[Path]) -> StepSplit:
    """The split of a profile session with the profile plugin's converter
    (`xprof.convert.raw_to_tool_data`: a C library of its own, through ctypes, nothing of
    TensorFlow). Its C++ log lines are held back unless it fails (`run_quietly`). Raises
    NoSteps when it found no step, RuntimeError when it could not convert."""
    from mgpu_env.tfprobes.tfimport import STARTUP_LOG, run_quietly

    if not xspaces:
        raise NoSteps("no profile was written (no .xplane.pb file)")

    def tool_data() -> Any:
        from xprof.convert import raw_to_tool_data

        data, _ = raw_to_tool_data.xspace_to_tool_data(
            [str(path) for path in xspaces], TOOL, {"use_saved_result": False})
        return data

    data = run_quietly(tool_data, show=STARTUP_LOG.show)
    if data is None:
        raise RuntimeError(f"xprof could not convert the profile in {xspaces[0].parent}")
    return split_from_tool_json(data)
