"""`mgpu train`'s memory check: a batch that cannot fit is refused before the first step.

Each replica's memory for the model and the batch is estimated before TensorFlow starts in
this process, against each GPU's memory from NVML; a batch that cannot fit is refused there
(ConfigError, exit 2, with the largest batch per replica that fits), not met as an
out-of-memory error at the first step.

A named step after the pure plan (it starts a child and imports the user's code, so the
plan cannot hold it), decided and made here only, its `MemoryCheck` passed down to the
summaries and metrics.json. The model is built in a child (`step.memprobe`), on the CPU.
When: the sequence runs it as soon as the data's shape is known: from the plan for a
built-in data set (so before the pre-flight, which imports TensorFlow where there are
GPUs); a loader's or a folder's shape is known only by loading the data, so `prepare` runs
it right after the load, before the model is built.

After the first call of steps, `FirstPeak` reads each GPU's peak (TensorFlow's allocator)
to set beside the estimate in metrics.json and the last lines; the CPU has no such count,
so it is recorded as absent (null).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mgpu_env.estimate.memory import MemoryEstimate, compare, device_peaks, size_text
from mgpu_env.hardware.nvml import GpuInfo
from mgpu_env.training.input.data import DataSizes
from mgpu_env.training.run.plan import TrainPlan
from mgpu_env.training.step import memprobe

Measure = Callable[[memprobe.MemoryRequest, Mapping[str, str]], memprobe.Measured]


@dataclass(frozen=True)
class MemoryCheck:
    """The check's outcome: the estimate (None: not made, `lines` say why), the summary's
    lines (the estimate, then each GPU's share), and the notes for the plan (a user's
    MODEL: built, its parameters)."""

    estimate: MemoryEstimate | None
    lines: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """For `--dry-run --json`: the estimate's parts in bytes (null when not made)."""
        return {"estimate": self.estimate.as_dict() if self.estimate else None,
                "lines": list(self.lines)}


def measured_gpus(plan: TrainPlan) -> list[GpuInfo]:
    """The selected GPUs whose total memory NVML reports: what an estimate is compared
    with."""
    return [gpu for gpu in plan.runtime.selection.gpus
            if gpu.memory_total_mib.ok and gpu.memory_total_mib.value]


def check_memory(plan: TrainPlan, sizes: DataSizes, *, dry_run: bool,
                 measure: Measure | None = None,
                 environ: Mapping[str, str] | None = None) -> MemoryCheck:
    """Estimate each replica's memory for the plan's model at its batch, on data of
    `sizes`' shape, and compare it with the selected GPUs' memory.

    The child runs where there is a GPU memory to compare with (a refusal is then possible)
    and always in a dry run (a user sees the estimate on a CPU machine too). A CPU-only run
    skips it: the answer could refuse nothing, and the child's TensorFlow import would add
    seconds to every start. `measure`: how the model is measured (default: in the child,
    or a built-in model's answer an earlier start kept: `memprobe.measure`). Raises
    ConfigError: a batch that cannot fit, or a user's
    builder that fails in the child.
    """
    gpus = measured_gpus(plan)
    if not gpus and not dry_run:
        why = ("NVML does not report the selected GPUs' memory" if plan.runtime.selection.gpus
               else "on the CPU there is no device memory")
        return MemoryCheck(None, (f"not estimated: {why} to compare with (mgpu train "
                                  "--dry-run shows the estimate)",))
    request = memprobe.MemoryRequest(
        plan.model, plan.settings.seed, tuple(sizes.sample_shape), sizes.num_classes,
        plan.per_replica_batch_size, plan.settings.learning_rate, plan.precision)
    try:
        measured = (measure or memprobe.measure)(
            request, os.environ if environ is None else environ)
    except memprobe.NotMeasured as why:
        return MemoryCheck(None, (f"not estimated: {why}",))
    lines = compare(measured.estimate, measured.assumed, gpus)  # ConfigError: cannot fit
    return MemoryCheck(measured.estimate, tuple(lines),
                       (measured.note,) if measured.note else ())


@dataclass
class FirstPeak:
    """An after-call action: each GPU's peak memory after the run's first call of steps
    (`estimate.memory.device_peaks`), read once. `peaks` stays None on CPUs (TensorFlow
    keeps no count there) and when no step ran. `read`: the probe (tests)."""

    devices: Sequence[str]
    read: Callable[[str], dict[str, int]] | None = None
    peaks: dict[str, int] | None = None
    done: bool = field(default=False)

    def __call__(self, call: object) -> None:
        if not self.done:
            self.done = True
            self.peaks = device_peaks(self.devices, self.read)


def memory_record(check: MemoryCheck, peak: FirstPeak) -> dict[str, Any]:
    """metrics.json's "memory": the estimate's parts and each GPU's first peak, in bytes
    (null where there is none)."""
    return {"estimate": check.estimate.as_dict() if check.estimate else None,
            "first_step_peak_bytes": peak.peaks}


def memory_result_line(record: Mapping[str, Any]) -> str | None:
    """The last lines' memory line, from metrics.json's "memory": estimate against peak.
    None with neither (a CPU run: the start summary already said why), so a first run on a
    laptop does not end on a line about what could not be measured."""
    estimate = record.get("estimate")
    said = (f"estimated {size_text(int(estimate['total']))} per replica" if estimate
            else "not estimated")
    peaks = record.get("first_step_peak_bytes")
    if peaks is None and not estimate:
        return None
    if peaks is None:
        return f"memory: {said}; no peak measured (TensorFlow counts GPU memory only)"
    measured = ", ".join(f"{device} {size_text(int(size))}" for device, size in peaks.items())
    return f"memory: {said}; first step's peak {measured or 'not readable'}"
