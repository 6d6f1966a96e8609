"""The all-reduce's expected time per step.

A ring all-reduce moves 2(n-1)/n times the gradient's bytes over each device's link, so at the
bus bandwidth busbw (nccl-tests' definition, what `mgpu doctor --smoke` measures) one step's
takes

    t = 2(n-1)/n x bytes / busbw.

The bytes are the model's trainable variables at the all-reduce's dtype: Keras all-reduces
the gradients in the variables' dtype (float32, under mixed precision too: the variables
stay float32).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


@dataclass(frozen=True)
class AllReducePrediction:
    """The predicted all-reduce per step, and what it was predicted from."""

    gradient_bytes: int
    replicas: int
    bus_gbps: float | None
    bus_source: str  # "doctor's busbw sweep at <size>", "NVML link class: ...", or why none
    seconds: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"gradient_bytes": self.gradient_bytes, "replicas": self.replicas,
                "bus_gbps": self.bus_gbps, "bus_source": self.bus_source,
                "seconds": self.seconds,
                "formula": "2(n-1)/n x gradient bytes / bus bandwidth"}


def gradient_bytes(variables: Iterable[Any]) -> int:
    """The bytes one all-reduce of these (trainable) variables' gradients moves per replica:
    each variable's element count times its dtype's size."""
    total = 0
    for variable in variables:
        elements = 1
        for dim in variable.shape:
            elements *= int(dim)
        total += elements * DTYPE_BYTES[_dtype_name(variable)]
    return total


def _dtype_name(variable: Any) -> str:
    dtype = variable.dtype
    return str(getattr(dtype, "name", dtype))


def ring_seconds(size_bytes: int, replicas: int, bus_gbps: float) -> float:
    """2(n-1)/n x bytes / busbw, in seconds; 0 for one replica (nothing to reduce)."""
    if replicas < 2:
        return 0.0
    if bus_gbps <= 0:
        raise ValueError(f"bus bandwidth must be positive, got {bus_gbps} GB/s")
    return 2 * (replicas - 1) / replicas * size_bytes / (bus_gbps * 1e9)


def nearest_bandwidth(sweep: Sequence[tuple[int, float]], size_bytes: int
                      ) -> tuple[int, float] | None:
    """The sweep's (message bytes, busbw) nearest `size_bytes` on a log scale: the busbw
    of a message of about the gradient's size (small messages reach less of the link)."""
    usable = [(size, gbps) for size, gbps in sweep if size > 0 and gbps > 0]
    if not usable:
        return None
    return min(usable, key=lambda item: abs(math.log2(item[0]) - math.log2(max(size_bytes, 1))))


def predict(size_bytes: int, replicas: int, sweep: Sequence[tuple[int, float]] = (),
            link_class: tuple[float, str] | None = None) -> AllReducePrediction:
    """The prediction from the doctor's busbw sweep when there is one, else the NVML link
    class's bandwidth, else none (said why)."""
    if replicas < 2:
        return AllReducePrediction(size_bytes, replicas, None, "one replica: no all-reduce",
                                   0.0)
    nearest = nearest_bandwidth(sweep, size_bytes)
    if nearest is not None:
        size, gbps = nearest
        return AllReducePrediction(
            size_bytes, replicas, gbps,
            f"mgpu doctor --smoke's busbw sweep, at {size >> 20} MiB",
            ring_seconds(size_bytes, replicas, gbps))
    if link_class is not None:
        gbps, what = link_class
        return AllReducePrediction(size_bytes, replicas, gbps, f"NVML link class: {what}",
                                   ring_seconds(size_bytes, replicas, gbps))
    return AllReducePrediction(size_bytes, replicas, None,
                               "no bus bandwidth: no busbw sweep, and NVML gave no link", None)
