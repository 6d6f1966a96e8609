"""Which of the GPUs a run used fail the doctor's health check, and why.

The doctor's own check (`doctor.checks.health.failing`) on a fresh NVML snapshot
(`hardware.nvml.snapshot`).
"""

from __future__ import annotations

from collections.abc import Sequence

from mgpu_env.doctor.checks.health import failing
from mgpu_env.hardware import nvml, nvmlerrors


def failing_gpus(used: Sequence[int]) -> dict[int, str]:
    """Each GPU of `used` that is not fit to train on now (nvidia-smi index -> why): one
    NVML cannot reach (fallen off the bus, reset required), one a health error marks
    (uncorrectable ECC errors, retired pages pending), one NVML no longer lists. NVML
    itself unanswering says nothing of any one GPU: none is left out for it."""
    listing = nvml.snapshot().listing
    if not listing.available and not listing.failed:
        return {}
    out: dict[int, str] = {}
    for lost in listing.failed:
        if lost.index in used:
            name = nvmlerrors.describe(lost.code).name if lost.code is not None else "NVML"
            out[lost.index] = f"{name}: {lost.error}"
    listed = {gpu.index: gpu for gpu in listing.gpus}
    for index in used:
        if index in out:
            continue
        gpu = listed.get(index)
        if gpu is None:
            out[index] = "NVML no longer lists it"
        elif errors := failing(gpu):
            out[index] = "; ".join(errors)
    return out
