"""How much training data stays on each device, the rest streaming from the host.

Decided once per run (`plan.plan_training`), from the memory the selected devices have free
when the run starts, and passed down: the run's feed plan (`feeds.plan_feed`: kept or
streamed, and the steps per epoch) is decided from it and the data. Kept rows cost nothing
per step (`feeds.ResidentFeed`); the stream (`feeds.StreamFeed`) costs host work, so data
is kept whenever it leaves the model room:

- on GPUs: KEEP_FRACTION of the smallest selected device's free memory (NVML; a logical
  device's share when GPUs are split), less MODEL_RESERVE_BYTES for the model, its
  activations, the optimizer and the call's gathered rows. An H200 with 139 GiB free keeps
  up to 67.5 GiB; a GPU with 7.5 GiB free, 1.75 GiB;
- on the CPU, where a kept copy lives in host memory beside the arrays it is made from:
  HOST_KEEP_FRACTION of the memory the kernel calls available (MemAvailable);
- where the free memory is unknown (NVML could not say, no /proc/meminfo), or the run spans
  workers, whose devices may differ while every worker must take the same path:
  FALLBACK_BYTES (2 GiB), what every run kept before the limit followed the devices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
KEEP_FRACTION = 0.5
MODEL_RESERVE_BYTES = 2 * GIB
HOST_KEEP_FRACTION = 0.25
FALLBACK_BYTES = 2 * GIB


@dataclass(frozen=True)
class KeepLimit:
    """The most bytes of training rows (float32 samples and int32 labels) kept on each
    device, and where the number comes from, for the plan's notes."""

    bytes: int
    reason: str

    def keeps(self, data_bytes: int) -> bool:
        return data_bytes <= self.bytes

    def keeps_rows(self, sample_shape: Sequence[int], rows: int) -> bool:
        """Whether `rows` training rows are kept on every device (else they stream from the
        host)."""
        return self.keeps(rows_bytes(sample_shape, rows))

    def note(self) -> str:
        return (f"training data of up to {self.bytes / GIB:.1f} GiB is kept on each device, "
                f"more streams from host memory ({self.reason})")


FALLBACK = KeepLimit(FALLBACK_BYTES, "the fixed limit")


def rows_bytes(sample_shape: Sequence[int], rows: int) -> int:
    """What `rows` training rows take on a device: the float32 samples and int32 labels the
    step takes."""
    return rows * (math.prod(sample_shape) + 1) * 4


def keep_limit(
    device_free_mib: Sequence[int | None],
    host_available_bytes: int | None,
    *,
    cpu_replicas: int = 1,
    workers: int = 1,
) -> KeepLimit:
    """The run's limit. `device_free_mib`: each selected GPU's free memory in MiB, already
    divided among its logical devices where it is split (empty on the CPU; None where NVML
    could not say); `host_available_bytes`: MemAvailable (None when unknown), shared by the
    `cpu_replicas` logical CPU devices, each of which keeps a copy."""
    if workers > 1:
        return KeepLimit(FALLBACK_BYTES, "the fixed limit: every worker must decide alike")
    if device_free_mib:
        if any(free is None for free in device_free_mib):
            return KeepLimit(FALLBACK_BYTES, "the fixed limit: a GPU's free memory is unknown")
        smallest = min(free for free in device_free_mib if free is not None) * 1024**2
        limit = max(0, int(smallest * KEEP_FRACTION) - MODEL_RESERVE_BYTES)
        return KeepLimit(limit, f"{KEEP_FRACTION:.0%} of {smallest / GIB:.1f} GiB free on the "
                                f"smallest device, less {MODEL_RESERVE_BYTES / GIB:.0f} GiB "
                                "for the model")
    if host_available_bytes is None:
        return KeepLimit(FALLBACK_BYTES, "the fixed limit: host memory is unknown")
    copies = max(cpu_replicas, 1)
    return KeepLimit(int(host_available_bytes * HOST_KEEP_FRACTION) // copies,
                     f"{HOST_KEEP_FRACTION:.0%} of {host_available_bytes / GIB:.1f} GiB of "
                     "available host memory" + (f", shared by {copies} CPU replicas"
                                                if copies > 1 else ""))


def host_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable from the kernel (None where there is no /proc/meminfo): a probe that
    tests replace."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable" and value.split():
            return int(value.split()[0]) * 1024  # kB
    return None
