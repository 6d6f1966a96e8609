"""The bottleneck named from the step's split, with what helps.

Pure.

One of four, tested in this order:
- input-bound: the step waits for its input (the profiler's `input` share, from
  INPUT_BOUND_SHARE: xprof calls a step "highly input-bound" from 20% of its time).
- all-reduce-bound: the collectives the profiler measured (GPUs), or, where it cannot see
  them (CPU devices: the all-reduce is host compute there), the ring all-reduce's predicted
  time, reach ALLREDUCE_BOUND_SHARE of the step.
- overhead-bound: the step is too short for its fixed costs: kernel launch, compilation and
  the profiler's "all others" (Python, the runtime between ops), or the measured cost of a
  call that does nothing (`call_ms`, `steps.call_cost_ms`), reach OVERHEAD_BOUND_SHARE, or
  the whole step is under OVERHEAD_STEP_MS. On CPU devices the profiler counts a call's
  own cost as host compute, so there the step's length is what tells: one `assign_add` per
  `tf.function` call, with the step marker and a read to the host, measured 0.34 ms per
  step here on a quiet moment of 2 shared cores, and over 1 ms on a busy one; a step
  within a few times that is mostly its fixed cost.
- compute-bound: none of these; the healthy case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mgpu_env.profile.split import COLLECTIVES_KEYS, StepSplit

INPUT_BOUND_SHARE = 0.20
ALLREDUCE_BOUND_SHARE = 0.20
OVERHEAD_BOUND_SHARE = 0.50
OVERHEAD_STEP_MS = 2.0
OVERHEAD = ("kernel_launch", "compilation", "other")
# NVIDIA's published TensorFlow ResNet-50 training runs (DeepLearningExamples, DGX-1/DGX-2,
# 8 GPUs): 7.3 to 7.7 times one GPU's throughput, 92-96% weak-scaling efficiency.
REFERENCE_WHAT = "NVIDIA's TensorFlow ResNet-50, 8 GPUs: 7.3-7.7x one GPU"
REFERENCE_EFFICIENCY = (0.92, 0.96)

FIXES: dict[str, tuple[str, ...]] = {
    "input-bound": (
        "keep the data on the devices (KEEP_DATA large enough for it: the feed kept on each "
        "device reads no input per step)",
        "more parallel reads and a larger prefetch for a streamed feed (tf.data's "
        "num_parallel_calls, prefetch; files: more shards)",
    ),
    "all-reduce-bound": (
        "a larger batch per replica (BATCH_SIZE): the same gradient bytes for more work",
        "half-size gradients (MIXED_PRECISION=fp16 or bf16 halves activations; an "
        "all-reduce in float16 halves the bytes)",
        "the all-reduce and link settings mgpu doctor --smoke checks (CROSS_DEVICE_OPS, "
        "NVLink/P2P, NCCL_* variables)",
    ),
    "overhead-bound": (
        "more steps per compiled call, so the launch cost is paid once for many (mgpu "
        "train runs STEPS_PER_CALL=200 per call; a script: Keras' steps_per_execution, or a "
        "tf.range loop inside its tf.function)",
        "XLA=1: fused kernels, fewer launches",
        "a larger batch per replica, so each step has more work for its fixed cost",
    ),
    "compute-bound": (
        "nothing to fix in the scaling: the devices compute; mixed precision and XLA make "
        "the compute itself faster",
    ),
}


@dataclass(frozen=True)
class Verdict:
    """The bottleneck, the share of the step that decided it, why, and what helps."""

    bottleneck: str
    share: float
    why: str
    fixes: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"bottleneck": self.bottleneck, "share": self.share, "why": self.why,
                "fixes": list(self.fixes)}


def judge(split: StepSplit, device_type: str, predicted_allreduce_s: float | None = None,
          call_ms: float | None = None) -> Verdict:
    """Name the bottleneck of a split (see the module's docstring). `device_type` "CPU":
    the profiler sees no collectives, so the prediction stands in for them. `call_ms`: what
    a call that does nothing costs here, measured beside the profile (the profiler counts
    that cost as host compute on CPU devices)."""
    input_share = split.share("input")
    if input_share >= INPUT_BOUND_SHARE:
        return _verdict("input-bound", input_share,
                        f"{100 * input_share:.0f}% of the step waits for input")
    measured = split.share(*COLLECTIVES_KEYS)
    if device_type != "CPU" and measured >= ALLREDUCE_BOUND_SHARE:
        return _verdict("all-reduce-bound", measured,
                        f"{100 * measured:.0f}% of the step is collectives and copies "
                        "between devices")
    if device_type == "CPU" and predicted_allreduce_s and split.step_ms > 0:
        predicted = 1000.0 * predicted_allreduce_s / split.step_ms
        if predicted >= ALLREDUCE_BOUND_SHARE:
            return _verdict("all-reduce-bound", predicted,
                            f"the predicted all-reduce is {100 * predicted:.0f}% of the step")
    overhead = split.share(*OVERHEAD)
    typical = split.typical_step_ms  # the median step: one interrupted step moves no verdict
    if call_ms and typical > 0:
        overhead = max(overhead, min(1.0, call_ms / typical))
    if 0 < typical < OVERHEAD_STEP_MS:
        return _verdict("overhead-bound", overhead,
                        f"a {typical:.2f} ms step is too short for its fixed cost "
                        f"(under {OVERHEAD_STEP_MS:.0f} ms)")
    if overhead >= OVERHEAD_BOUND_SHARE:
        return _verdict("overhead-bound", overhead,
                        f"{100 * overhead:.0f}% of a {split.step_ms:.2f} ms step is launch, "
                        "compilation, time between ops or the call's own cost")
    compute = split.share("device_compute", "host_compute")
    return _verdict("compute-bound", compute, f"{100 * compute:.0f}% of the step computes")


def _verdict(bottleneck: str, share: float, why: str) -> Verdict:
    return Verdict(bottleneck, share, why, FIXES[bottleneck])


def against_reference(efficiency: float, replicas: int) -> str:
    """The efficiency beside the published reference's, in words."""
    low, high = REFERENCE_EFFICIENCY
    place = "within" if low <= efficiency <= high else (
        "above" if efficiency > high else "below")
    return (f"{100 * efficiency:.0f}% at {replicas} replicas, {place} the reference's "
            f"{100 * low:.0f}-{100 * high:.0f}% ({REFERENCE_WHAT})")
