"""A trainer's replica step, profiled.

A trainer's replica step profiled: `mgpu bench --explain`'s points and `mgpu train
--profile STEPS` (PROFILE=STEPS) both come here.

The profiled steps call the trainer's replica step once per `tf.function` call (the
profiler finds no step inside the training loops' `tf.while_loop`: `profile.trace`), fed
either one batch already on each device (no input: synthetic) or a per-step tf.data
iterator over the training arrays (batch, prefetch, distributed): the input path TensorFlow's
profiler can attribute. The same steps are timed unprofiled too, for the profiler's
overhead. `keep_weights` puts every model and optimizer variable back afterwards, so a
profiled training run trains exactly as an unprofiled one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYNTHETIC_INPUT = "none: one batch already on each device"
DATA_INPUT = "a per-step tf.data iterator over the training arrays (batch, prefetch)"


@dataclass(frozen=True)
class StepSource:
    """Where the profiled steps' batches come from: `batch`, per-replica values already on
    the devices (a synthetic point), else `arrays`' x_train/y_train in batches of
    `global_batch`."""

    batch: Any = None
    arrays: Any = None
    global_batch: int = 0


def profile_replica_step(
    trainer: Any, logdir: Path, steps: int, source: StepSource, *, keep_weights: bool = False,
) -> dict[str, Any]:
    """Profile `steps` of the trainer's replica steps into `logdir`, fed from `source`.
    Returns the split (`StepSplit.as_dict`), the unprofiled step time and the profiler's
    overhead, or the reason the profile could not be split under "error"."""
    import tensorflow as tf

    from mgpu_env.profile.split import NoSteps
    from mgpu_env.profile.trace import profile_split

    strategy = trainer.strategy
    iterator, profiled_input = _iterator(strategy, source)
    variables = [*trainer.model.variables, *trainer.optimizer.variables]
    saved = [variable.numpy() for variable in variables] if keep_weights else []

    @tf.function
    def one_step(batches: Any) -> None:
        strategy.run(trainer.steps.replica_step, args=next(batches))

    def step() -> None:
        one_step(iterator)
        trainer.optimizer.iterations.numpy()  # waits for the step: its work in its marker

    step()  # traced outside the profile: its compilation is not the steps'
    result: dict[str, Any] = {"profiled_input": profiled_input, "profile_dir": str(logdir),
                              "unprofiled_step_ms": _median_ms(step, steps),
                              "call_ms": call_cost_ms(strategy, steps)}
    try:
        split = profile_split(logdir, step, steps)
        result["peak_memory_bytes"] = _peak_memory(strategy)
        result["split"] = split.as_dict()
        unprofiled = result["unprofiled_step_ms"]
        result["profiler_overhead"] = split.step_ms / unprofiled - 1 if unprofiled else None
    except (NoSteps, RuntimeError) as err:
        result["error"] = f"the profile could not be split: {err}"
    finally:
        for variable, value in zip(variables, saved, strict=False):
            variable.assign(value)
    return result


def _iterator(strategy: Any, source: StepSource) -> tuple[Any, str]:
    import tensorflow as tf

    if source.batch is not None:
        return _SameBatch(source.batch), SYNTHETIC_INPUT
    arrays = source.arrays
    dataset = tf.data.Dataset.from_tensor_slices((arrays.x_train, arrays.y_train)).repeat()
    dataset = dataset.batch(source.global_batch, drop_remainder=True).prefetch(
        tf.data.AUTOTUNE)
    return iter(strategy.experimental_distribute_dataset(dataset)), DATA_INPUT


def call_cost_ms(strategy: Any, calls: int) -> float:
    """What one step's call costs with no work in it, here and now (median ms): a
    `tf.function` running an empty replica function on every replica, then a value read
    to the host, as a profiled step ends. The step's fixed cost, beside its time."""
    import tensorflow as tf

    @tf.function
    def nothing() -> Any:
        return strategy.run(lambda: tf.zeros(()))

    def call() -> None:
        strategy.experimental_local_results(nothing())[0].numpy()

    call()
    return _median_ms(call, calls)


def _peak_memory(strategy: Any) -> dict[str, int]:
    """Each GPU's peak memory so far (TensorFlow's allocator), to set beside the estimate;
    empty on CPUs, where TensorFlow keeps no such count."""
    from mgpu_env.estimate.memory import device_peaks

    return device_peaks(strategy.extended.worker_devices) or {}


class _SameBatch:
    """Yields one batch already on the devices, step after step: no input at all (the
    tf.function takes the same object every call, so it is traced once)."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __iter__(self) -> _SameBatch:
        return self

    def __next__(self) -> Any:
        return self.batch


def _median_ms(step: Callable[[], None], steps: int) -> float:
    """Median milliseconds of `steps` unprofiled steps."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(1000.0 * (time.perf_counter() - start))
    return statistics.median(times)


def split_lines(result: dict[str, Any]) -> list[str]:
    """The split in a few lines for a terminal: step time, then each category's share."""
    from mgpu_env.profile.split import CATEGORIES

    if "split" not in result:
        return [f"profile: {result.get('error', 'no split')}"]
    split = result["split"]
    parts = ", ".join(f"{name} {100 * split['share'][key]:.0f}%"
                      for key, _, name in CATEGORIES if split["ms"][key] > 0)
    overhead = result.get("profiler_overhead")
    return [
        f"profile: {split['steps']} steps of {split['step_ms']:.2f} ms (unprofiled "
        f"{result['unprofiled_step_ms']:.2f} ms"
        + (f", profiler overhead {100 * overhead:+.0f}%" if overhead is not None else "")
        + f"); input: {result['profiled_input']}",
        f"profile: {parts}",
        f"profile: in {result['profile_dir']} (tensorboard --logdir {result['profile_dir']}, "
        "Profile tab)",
    ]


def profile_training(trainer: Any, logdir: Path, steps: int, data: Any,
                     global_batch: int) -> list[str]:
    """`mgpu train --profile STEPS`: `steps` steps of the run's model profiled into its
    logs/ folder before its first epoch, every weight put back after (the run trains as it
    would unprofiled); the split's lines for the terminal. Data held as arrays feeds them
    through tf.data; other data (streamed files) gives way to one batch of zeros already on
    each device."""
    import tensorflow as tf

    batch, strategy = None, trainer.strategy
    if not hasattr(data, "x_train"):
        shape = tuple(trainer.model.input_shape[1:])
        per_replica = global_batch // strategy.num_replicas_in_sync
        batch = strategy.experimental_distribute_values_from_function(
            lambda _: (tf.zeros((per_replica, *shape)), tf.zeros((per_replica,), tf.int32)))
    result = profile_replica_step(trainer, logdir, steps,
                                  StepSource(batch, data, global_batch), keep_weights=True)
    return split_lines(result)
