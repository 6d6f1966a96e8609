"""`mgpu bench --explain`: where each point's step time goes.

As TensorFlow's profiler splits it, the all-reduce predicted beside it, and the bottleneck with
its fix.

In the child (`explain_variant`): EXPLAIN_STEPS steps of the point's model and strategy are
traced by TensorFlow's profiler (`profile.trace`) and split by the profile plugin's converter
(`profile.split`); the same steps are timed unprofiled, for the profiler's overhead; the
gradient's bytes are read from the model's trainable variables, and with 2 or more replicas
the doctor's bus-bandwidth sweep runs on the same strategy (`doctor.links.bandwidth`).

The profiled steps call the replica step once per `tf.function` call (the profiler finds no
step inside the training loops' `tf.while_loop`, see `profile.trace`): a synthetic point on
its batch already on the devices, a data point through a per-step tf.data iterator over
DATASET (`profile.steps`): the input path TensorFlow's profiler can attribute, not the
chunked one the timed intervals use. The per-call step also pays the call's own cost, which
the timed loops spread over many steps: its step time is longer than the table's.

After the rounds (`trace_intervals`), TRACED_INTERVALS more intervals of every variant, taking
turns as the rounds do, run on the timed feed itself under the profiler: the input's cost as
the trace reads it (`profile.wait`: the steps' wait, and on CPU devices the pipeline threads'
share of the cores), of the same feed the throughput lost measures.

In the parent (`explain_points`): the prediction (`estimate.allreduce`), the verdict
(`profile.verdict`) and the efficiency against the published reference, per point.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mgpu_env.profile.steps import StepSource

EXPLAIN_STEPS = 10
# Timed-feed intervals traced per variant: each takes a second more (the profiler's sessions
# are named by the second), and the median of 3 is the reading.
TRACED_INTERVALS = 3


def trace_intervals(runs: Sequence[Callable[[int], Any]], steps: int,
                    logdirs: Sequence[Path], step_on_host: bool) -> list[dict[str, Any]]:
    """Trace TRACED_INTERVALS intervals of `steps` steps of each variant (`runs[v](n)` runs
    n steps and returns once done), in the rounds' order, each after its lead-in as in the
    rounds (`rounds.lead_in_steps`), into `logdirs[v]/intervals`; per
    variant the medians of the wait, the pipeline's share and the input's cost
    (`InputWait.cost_share`), or why the trace could not be read."""
    from mgpu_env.bench.rounds import lead_in_steps, round_orders
    from mgpu_env.profile.split import NoSteps
    from mgpu_env.profile.wait import trace_wait

    found: list[list[Any]] = [[] for _ in runs]
    errors: list[str | None] = [None for _ in runs]
    lead_in = lead_in_steps(len(runs), steps)
    for number, order in enumerate(round_orders(len(runs), TRACED_INTERVALS)):
        for variant in order:
            if lead_in:  # as before each timed interval, untraced
                runs[variant](lead_in)
            try:
                found[variant].append(trace_wait(
                    logdirs[variant] / "intervals" / str(number), partial(runs[variant], steps)))
            except (NoSteps, RuntimeError) as err:
                errors[variant] = f"the timed feed's trace could not be read: {err}"
    results: list[dict[str, Any]] = []
    for readings, error in zip(found, errors, strict=True):
        if error or not readings:
            results.append({"error": error or "no interval traced"})
            continue
        results.append({
            "traced": len(readings),
            "steps": steps,
            "wait_share": statistics.median(r.share for r in readings),
            "pipeline_share": statistics.median(r.pipeline_share for r in readings),
            "cost_share": statistics.median(r.cost_share(step_on_host) for r in readings),
            "step_on_host": step_on_host,
            "cores": readings[0].cores,
        })
    return results


def explain_variant(spec: Any, trainer: Any, source: StepSource, logdir: Path
                    ) -> dict[str, Any]:
    """Profile one variant's steps into `logdir` (`profile.steps`): the split and the
    unprofiled step time, then the gradient's bytes and (2+ replicas) the bus bandwidth
    sweep. `source`: the synthetic point's per-replica batch, else DATASET's arrays.
    Never raises for a profile the converter cannot read: the reason is recorded instead."""
    from mgpu_env.estimate.allreduce import gradient_bytes
    from mgpu_env.profile.steps import profile_replica_step

    result = profile_replica_step(trainer, logdir, EXPLAIN_STEPS, source)
    result["gradient_bytes"] = gradient_bytes(trainer.model.trainable_variables)
    result["memory_estimate"] = _memory_estimate(trainer, spec.per_replica_batch)
    result["busbw_sweep"] = _busbw_sweep(trainer.strategy, spec.replicas)
    return result


def _memory_estimate(trainer: Any, per_replica_batch: int) -> dict[str, int]:
    """The memory estimate (`estimate.memory`) for this point's model, optimizer and batch,
    to set beside the GPUs' measured peak."""
    from mgpu_env.estimate.memory import COMPUTE_DTYPE, measure

    policy = str(getattr(getattr(trainer.model, "dtype_policy", None), "name", "float32"))
    # An optimizer of the user's is taken as Adam (two slots), as training's check takes it.
    return measure(trainer.model, trainer.optimizer, per_replica_batch,
                   policy if policy in COMPUTE_DTYPE else "float32")[0].as_dict()


def _busbw_sweep(strategy: Any, replicas: int) -> list[list[float]]:
    """`mgpu doctor --smoke`'s bus-bandwidth sweep on this strategy: [[bytes, GB/s], ...];
    empty for one replica or when it failed."""
    if replicas < 2:
        return []
    import tensorflow as tf

    from mgpu_env.doctor import links

    ok, _, values = links.bandwidth(tf, strategy, replicas, "")
    return [[size, gbps] for size, gbps in values] if ok else []


def explain_points(points: Sequence[dict[str, Any]],
                   link_class: tuple[float, str] | None) -> None:
    """Add to each explained point (in place) the all-reduce predicted, the collectives the
    profile measured, the efficiency lost and the verdict."""
    from mgpu_env.estimate.allreduce import predict
    from mgpu_env.profile.split import COLLECTIVES_KEYS, StepSplit
    from mgpu_env.profile.verdict import against_reference, judge

    for point in points:
        explained = point.get("explain")
        if point.get("error") or not explained:
            continue
        sweep = [(int(size), float(gbps)) for size, gbps in explained.get("busbw_sweep", ())]
        prediction = predict(explained["gradient_bytes"], point["replicas"], sweep, link_class)
        explained["allreduce"] = prediction.as_dict()
        if "split" not in explained:
            continue
        split = StepSplit.from_dict(explained["split"])
        device_type = point.get("worker", {}).get("device_type", "CPU")
        explained["collectives_measured_ms"] = (
            None if device_type == "CPU" else sum(split.ms[key] for key in COLLECTIVES_KEYS))
        explained["verdict"] = judge(split, device_type, prediction.seconds,
                                     explained.get("call_ms")).as_dict()
        timed = point.get("step_time_ms", {}).get("median")
        if timed and explained.get("unprofiled_step_ms"):
            # A profiled step is one call; the timed loop runs many per call: the gap is
            # the call's own cost, which the loop spreads over its steps.
            explained["loop_step_ms"] = timed
            explained["call_share"] = max(0.0, 1.0 - timed / explained["unprofiled_step_ms"])
        efficiency = point.get("efficiency")
        if efficiency is not None and point["replicas"] > 1:
            explained["efficiency_lost"] = 1.0 - efficiency
            explained["reference"] = against_reference(efficiency, point["replicas"])
