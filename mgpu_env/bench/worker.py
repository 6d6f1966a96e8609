"""One point of `mgpu bench`, measured in a process of its own.

One point of `mgpu bench` with its data variants, in a process of its own: `python -m
mgpu_env.bench.worker SPECS`.

SPECS is a JSON list of `PointSpec`s that differ only in their data (synthetic, kept,
streamed), or the seed's one. The parent has already put the point's GPUs in
CUDA_VISIBLE_DEVICES; the worker splits devices (VIRTUAL_DEVICES is fixed once per process,
hence one process per replica count), builds the strategy and one model and step per
variant, warms each up, times `intervals` rounds of one interval of `steps_per_interval`
steps of each variant in turn, and prints one line: RESULT_PREFIX + JSON, {"points": [one
result per spec]} or {"error": ...}. Each timed interval ends by fetching a value to the
host, so asynchronous execution is finished inside the interval.
"""

from __future__ import annotations

import itertools
import json
import platform
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgpu_env.bench.explain import TRACED_INTERVALS, trace_intervals
from mgpu_env.bench.models import ModelShape
from mgpu_env.bench.plan import RESULT_PREFIX, PointSpec
from mgpu_env.bench.rounds import lead_in_steps, warmup_intervals
from mgpu_env.config.errors import ConfigError, MgpuError
from mgpu_env.config.exitcodes import EXIT_BAD_CONFIG, EXIT_OK
from mgpu_env.runtime import Execution
from mgpu_env.training.input.data import Data, DatasetChoice
from mgpu_env.training.shared.position import Position

if TYPE_CHECKING:
    from mgpu_env.training.input.feeds import Feed


@dataclass
class PointData:
    """What a point trains on: the model's sample shape, and DATASET's arrays when the
    point feeds them (`real`, `stream`) or they set that shape (a DATASET loader)."""

    choice: DatasetChoice
    arrays: Data | None
    shape: ModelShape


def point_data(spec: PointSpec) -> PointData:
    """Load DATASET when this point needs it. Built-in data sets are rows of 784 values,
    which the model's own shape takes (the ResNet's images are made of them in the step);
    a loader's samples give the model their shape, on synthetic points too, so real and
    synthetic data are measured on the same model."""
    from mgpu_env.bench.models import model_shape
    from mgpu_env.training.input.data import load_arrays, load_data, resolve_dataset
    from mgpu_env.training.input.keep import KeepLimit

    choice = resolve_dataset(spec.dataset, Path(spec.data_dir) if spec.data_dir else None)
    if choice.origin == "hook":
        arrays = load_data(choice, spec.seed)
        shape = ModelShape(arrays.sample_shape, arrays.num_classes)
        if spec.model in ("resnet", "resnet50") and len(shape.input_shape) != 3:
            raise ConfigError(
                f"BENCH_MODEL={spec.model} takes images (height, width, channels), but "
                f"DATASET={spec.dataset} gives samples of shape {shape.input_shape}.\n"
                "  Fix: BENCH_MODEL=mlp, or MODEL=package.module:function for a model of "
                "your own."
            )
        return PointData(choice, arrays, shape)
    # Files are read whole under training's keep limit, as `mgpu train` would keep them.
    keep = KeepLimit(spec.keep_bytes, "training's keep limit")
    kept = None if spec.data == "synthetic" else load_arrays(choice, spec.seed, keep)
    return PointData(choice, kept, model_shape(spec.model))


def real_feed(spec: PointSpec, strategy: Any, data: PointData) -> tuple[Any, str]:
    """The training module's feed over DATASET: the rows kept on every device (`real`), or
    streamed through tf.data (`stream`, the path for data that does not fit)."""
    from mgpu_env.training.input.feeds import FeedMaking, kind_named, make_feed, plan_feed
    from mgpu_env.training.input.keep import KeepLimit

    assert data.arrays is not None  # point_data loads them for every non-synthetic point
    # Training's decision, with the limit the variant measures: none kept, or all.
    keep = KeepLimit(0 if spec.data == "stream" else sys.maxsize, f"BENCH {spec.data}")
    feed_plan = plan_feed(data.arrays, keep, spec.global_batch)
    # Streamed chunks that divide the intervals, as they divide training's calls.
    feed = make_feed(FeedMaking(strategy, data.arrays, feed_plan, spec.global_batch, spec.seed,
                                deterministic=spec.deterministic,
                                steps_per_call=spec.steps_per_interval))
    return feed, f"{data.choice.describe()}, {kind_named(feed_plan.kind).how}"


def image_maker(input_shape: tuple[int, ...]) -> Any:
    """For the ResNet: 784-value rows -> 32x32x3 images (reshape, pad by 2, repeat the
    channel), done in the step after the batch is cut, so it counts as input cost too."""
    import tensorflow as tf

    from mgpu_env.training.input.data import IMAGE_SIDE as side

    pad = (input_shape[0] - side) // 2

    def to_image(x: Any) -> Any:
        images = tf.reshape(x, (-1, side, side, 1))
        images = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
        return tf.repeat(images, input_shape[-1], axis=-1)

    return to_image


@dataclass
class Variant:
    """One data variant of a group, ready to run: `run_steps(n)` runs n steps through its
    feed's runner and returns once they are done."""

    spec: PointSpec
    trainer: Any
    run_steps: Callable[[int], int]
    feed: Feed
    data_source: str | None = None  # what DATASET feeds it (None: synthetic)


def measure_group(specs: Sequence[PointSpec]) -> list[dict[str, Any]]:
    """Measure the packaged training step on each data variant of one sweep point (same
    replicas, precision and XLA): `measure_variants` on the parent's decisions."""
    # The parent's decisions for this point: device split, precision, all-reduce.
    execution = Execution.from_json(specs[0].execution)
    execution.prepare_tensorflow()
    return measure_variants(specs, execution.make_strategy(), execution)


def measure_variants(
    specs: Sequence[PointSpec], strategy: Any, execution: Execution
) -> list[dict[str, Any]]:
    """Each variant's intervals, interleaved (`rounds.time_interleaved`): one trainer per
    variant, all in this process, on `strategy`. Then each streamed feed alone."""
    from mgpu_env.bench.input_alone import SampleBudget, measure_input_alone
    from mgpu_env.bench.rounds import Schedule, time_interleaved
    from mgpu_env.training.step.loops import Chunks

    first = specs[0]
    data = point_data(next((s for s in specs if s.data != "synthetic"), first))
    variants = [_variant(spec, strategy, data, execution, len(specs)) for spec in specs]
    schedule = Schedule(first.warmup_steps, first.steps_per_interval, first.intervals)
    timings = time_interleaved([v.run_steps for v in variants], schedule)
    traced = _trace_intervals(variants, execution.split.device_type)
    results = []
    for variant, timing, timed_feed in zip(variants, timings, traced, strict=True):
        spec = variant.spec
        result = _result(spec, timing.seconds, RanOn(
            execution.split.device_type, execution.split.names,
            variant.trainer.model.count_params(), execution.precision.policy))
        result["interval_starts"] = timing.starts
        result["interval_cpu_seconds"] = timing.cpu_seconds
        result["measured_with"] = [s.data for s in specs]
        result["cross_device_ops"] = execution.strategy_plan.cross_device_ops
        result["precision_reason"] = execution.precision.reason
        if spec.profile_dir:
            result["explain"] = _explain(variant, data)
            result["explain"]["timed_feed_input"] = timed_feed
        if variant.data_source is not None:
            result["data_source"] = variant.data_source
            if isinstance(source := variant.feed.source(Position(0)), Chunks):
                result["steps_per_chunk"] = source.lengths[0]
            result["input_alone"] = measure_input_alone(variant.feed, strategy, SampleBudget(
                spec.warmup_steps * spec.global_batch,
                spec.steps_per_interval * spec.intervals * spec.global_batch))
        results.append(result)
    return results


def _trace_intervals(variants: Sequence[Variant], device_type: str) -> list[dict[str, Any]]:
    """BENCH_EXPLAIN: the timed feeds' input read from traced intervals
    (`explain.trace_intervals`), right after the rounds; nothing without it."""
    specs = [v.spec for v in variants]
    if not specs[0].profile_dir:
        return [{} for _ in variants]
    return trace_intervals([v.run_steps for v in variants], specs[0].steps_per_interval,
                           [Path(str(s.profile_dir)) for s in specs], device_type == "CPU")


def _explain(variant: Variant, data: PointData) -> dict[str, Any]:
    """BENCH_EXPLAIN: this variant's steps profiled (`bench.explain`), after its rounds."""
    from mgpu_env.bench.explain import explain_variant
    from mgpu_env.bench.synthetic import SameBatchFeed
    from mgpu_env.profile.steps import StepSource

    batch = variant.feed.batches.batch if isinstance(variant.feed, SameBatchFeed) else None
    source = StepSource(batch, data.arrays, variant.spec.global_batch)
    return explain_variant(variant.spec, variant.trainer, source, Path(variant.spec.profile_dir))


def _variant(spec: PointSpec, strategy: Any, data: PointData, execution: Execution,
             variants: int) -> Variant:
    """A trainer of its own for one data variant (of `variants` taking turns), and its
    feed's runner, the loop `mgpu train` runs on that feed."""
    from mgpu_env.bench.models import build_model
    from mgpu_env.bench.synthetic import SameBatchFeed
    from mgpu_env.training.input.data import FEATURES
    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.loops import Chunks
    from mgpu_env.training.step.steps import StepSpec

    rows = data.arrays.sample_shape if data.arrays is not None else data.shape.input_shape
    # The training module's step: n steps per tf.function call, XLA on the per-replica
    # forward and backward pass only, loss scaling agreed between replicas. Built-in rows
    # become the ResNet's images in the step, so that counts as input cost too.
    trainer = build_trainer(
        strategy, lambda: build_model(spec.model, spec.seed, data.shape),
        StepSpec(learning_rate=spec.learning_rate, precision=execution.precision,
                 global_batch_size=spec.global_batch, jit_compile=spec.xla),
        prepare_input=image_maker(data.shape.input_shape)
        if rows == (FEATURES,) and data.shape.input_shape != rows else None,
    )
    feed: Feed
    data_source = None
    if spec.data == "synthetic":
        feed = SameBatchFeed.make(strategy, spec.per_replica_batch, data.shape.input_shape,
                                  data.shape.classes, spec.seed)
    else:
        warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data")
        feed, data_source = real_feed(spec, strategy, data)
    traced = TRACED_INTERVALS if spec.profile_dir else 0
    # The warm-up, the untimed round, then each timed or traced interval after its lead-in.
    lead_in = lead_in_steps(variants, spec.steps_per_interval)
    total = spec.steps_per_interval * (
        warmup_intervals(spec.warmup_steps, spec.steps_per_interval) + 1
        + spec.intervals + traced
    ) + lead_in * (spec.intervals + traced)
    if isinstance(first := feed.source(Position(0)), Chunks):
        # A chunk more: the run's last chunk is shorter, and its one more trace of the
        # step must not land in a timed interval.
        total += first.lengths[0]
    # As many epochs as the warm-up, the untimed round and the intervals take: they
    # follow one another as in training, each in its own order; the trainer's loop runs
    # them, as it runs training's.
    feed_steps = trainer.loops.runner(
        feed.source(Position(0), -(-total // feed.steps_per_epoch)))

    def run_steps(n: int) -> int:
        feed_steps(n)
        # Reading a variable to the host waits for the steps queued before it.
        return int(trainer.optimizer.iterations.numpy())

    return Variant(spec, trainer, run_steps, feed, data_source)


def measure_seed(spec: PointSpec) -> dict[str, Any]:
    """Measure the seed's plain script: MirroredStrategy(), compile, `model.fit` on numpy.

    The seed's code as written (the Sequential MLP, Adam, numpy arrays, one epoch, the
    default steps_per_execution of 1), on synthetic MNIST-shaped data and on the one device
    this process sees, with the same per-replica batch. The clock is read at the start of
    the batches that bound each interval, after reading a weight to the host (which waits
    for the steps before it); `on_train_batch_begin` keeps Keras' asynchronous dispatch on.
    The model is the seed's own (`mgpu_env.training.tutorial.seed_model`); `verbose=0` drops
    the seed's progress bar, which gives the seed its best case.
    """
    import numpy as np
    import tensorflow as tf

    from mgpu_env.runtime.keras import tensorflow_keras
    from mgpu_env.training import tutorial

    execution = Execution.from_json(spec.execution)
    execution.prepare_tensorflow()
    keras: Any = tensorflow_keras()
    keras.utils.set_random_seed(spec.seed)
    boundaries = [spec.warmup_steps + i * spec.steps_per_interval
                  for i in range(spec.intervals + 1)]
    samples = spec.per_replica_batch * (boundaries[-1] + 1)
    rng = np.random.default_rng(spec.seed)
    x_train = rng.random((samples, 784), dtype=np.float32)
    y_train = rng.integers(0, 10, size=samples)

    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = tutorial.seed_model(spec.learning_rate)

    clock: list[float] = []
    wanted = set(boundaries)

    class IntervalClock(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            if batch in wanted:
                model.optimizer.iterations.numpy()  # waits for the steps already queued
                clock.append(time.perf_counter())

    model.fit(x_train, y_train, epochs=1, batch_size=spec.per_replica_batch, verbose=0,
              callbacks=[IntervalClock()])
    durations = [end - start for start, end in itertools.pairwise(clock)]
    devices = tuple(strategy.extended.worker_devices)
    return _result(spec, durations, RanOn(execution.split.device_type, devices,
                                          model.count_params(), "float32"))


@dataclass(frozen=True)
class RanOn:
    """What a point's steps ran on, as bench.json records it beside their times."""

    device_type: str
    devices: tuple[str, ...]
    parameters: int
    dtype_policy: str


def _result(spec: PointSpec, durations: list[float], ran_on: RanOn) -> dict[str, Any]:
    import tensorflow as tf

    return {
        "interval_seconds": durations,
        "device_type": ran_on.device_type,
        "devices": list(ran_on.devices),
        "logical_devices": bool(spec.virtual_devices),
        "parameters": int(ran_on.parameters),
        "dtype_policy": ran_on.dtype_policy,
        "tensorflow": tf.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m mgpu_env.bench.worker '<JSON list of PointSpec>'",
              file=sys.stderr)
        return EXIT_BAD_CONFIG
    specs = [PointSpec(**fields) for fields in json.loads(argv[1])]
    try:
        if specs[0].runner == "seed":
            results = [measure_seed(spec) for spec in specs]
        else:
            results = measure_group(specs)
    except MgpuError as err:  # a message for the user: no traceback
        print(RESULT_PREFIX + json.dumps({"error": str(err)}), flush=True)
        return err.exit_code
    print(RESULT_PREFIX + json.dumps({"points": results}), flush=True)
    return EXIT_OK


if __name__ == "__main__":
    # The child process `mgpu bench` starts for each point (never imported by the CLI):
    # its exit code is how the parent learns the point failed.
    sys.exit(main(sys.argv))
