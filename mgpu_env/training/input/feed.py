"""How training batches reach the step: rows kept on every device, or a tf.data stream.

Data that fits (every built-in data set: MNIST's 60,000 rows are 188 MB) is `ResidentFeed`:
the rows are copied once onto each local replica's device, and each compiled call gathers
its steps' batches from them by index (`tf.gather`), following one permutation per epoch
drawn from (SEED, epoch) on the host. No host work, no host-to-device copy and no tf.data
per step: `mgpu bench` measured the element-wise tf.data pipeline (from_tensor_slices ->
shuffle -> batch -> experimental_distribute_dataset) at 67-73% of the CPU's training
throughput.

Data over the run's keep limit (`training.input.keep`: from the devices' free memory) is
`StreamFeed` (`training.input.stream`, with the other streams): kept in host memory, cut into
chunks of many steps' batches by one tf.data pipeline per worker through
`distribute_datasets_from_function`, prefetched to each replica's device.

A `DATASET` loader's tf.data set too big to read into memory (`data.Streamed`) is
`RowStreamFeed`: its rows stream from the loader's pipeline, shuffled in a buffer.

TFRecord files and image folders (`data.FileData`) are read whole into a `ResidentFeed`
when their decoded rows fit, else `FileStreamFeed`: each worker streams its share of the
files (`data.read.worker_rows`), in an order drawn from (SEED, epoch).

Which of them a run takes is decided once, by `training.input.feedplan.plan_feed`, and
recorded in the run's plan; `make_feed` builds the feed it names.

The rows' order is `training.input.order`'s. The first three follow one order per epoch (the
first two the same one) and give global batch b of an epoch the same rows whatever the
replica or worker count (`FileStreamFeed`'s order is SEED's and the epoch's too, but each
worker reads its own files): replica r (its id across all workers) of R takes rows
[b*G + r*G/R, b*G + (r+1)*G/R) of the epoch's order. The last partial global batch is
dropped (a different one each epoch, as the order changes), so every step has exactly the
global batch G.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from mgpu_env.training.input.data import (
    Arrays,
    Data,
    FileData,
    Streamed,
    as_float32,
    release_pages,
)
from mgpu_env.training.input.feedplan import FeedPlan, plan_feed
from mgpu_env.training.input.keep import KeepLimit
from mgpu_env.training.input.order import StepRunner, call_steps, each_device, epoch_order
from mgpu_env.training.input.stream import FileStreamFeed, RowStreamFeed, StreamFeed
from mgpu_env.training.shared.position import Position
from mgpu_env.training.step.loops import LoopCache, run_chunk
from mgpu_env.training.step.steps import StepFunctions

__all__ = [
    "Feed", "FileStreamFeed", "ResidentFeed", "RowStreamFeed",
    "StreamFeed", "epoch_order", "epoch_steps", "make_feed",
]

# The most bytes of rows one `ResidentFeed` call gathers on each device for its steps (the
# only memory a resident feed adds beyond the rows): 64 MiB is 320 of the MLP's 64-row
# batches, more than a training call's 200 steps; rows of large images get fewer per call.
CALL_ROWS_BYTES = 64 * 1024**2


def epoch_steps(data: Data, global_batch: int, workers: int, keep: KeepLimit) -> int:
    """Steps per epoch, as the run's feed plan counts them (`feedplan.plan_feed`)."""
    return plan_feed(data, keep, global_batch, workers).steps_per_epoch


@dataclass
class ResidentFeed:
    """The training rows, once on each local replica's device; batches are gathered by index
    in the compiled call (`gather_loop`)."""

    strategy: Any
    rows: Any  # (x, y), each a PerReplica of the whole training set on that replica's device
    size: int
    global_batch: int
    seed: int
    row_bytes: int  # one training row, x and y
    # The plan's count (`feedplan.plan_feed`), passed down: a feed never counts its own.
    steps_per_epoch: int = field(kw_only=True)
    loops: LoopCache[Any] = field(default_factory=LoopCache, repr=False, compare=False)

    @classmethod
    def place(cls, strategy: Any, arrays: Arrays, global_batch: int, seed: int, *,
              steps_per_epoch: int) -> ResidentFeed:
        """Copy the training rows onto every local replica's device (one copy each)."""
        # Memory-mapped or uint8 samples (an npy folder) become float32 here, once; the
        # file's pages, all read, need not stay in this process's memory.
        x_train = as_float32(arrays.x_train)
        release_pages(arrays.x_train)
        rows = _on_each_device(strategy, lambda: (x_train, arrays.y_train))
        row_bytes = (x_train.nbytes + arrays.y_train.nbytes) // max(arrays.train_size, 1)
        return cls(strategy, rows, arrays.train_size, global_batch, seed, row_bytes,
                   steps_per_epoch=steps_per_epoch)

    @property
    def steps_per_call(self) -> int:
        """The most steps one compiled call runs: their rows, gathered at its start, stay
        within CALL_ROWS_BYTES on each device."""
        return call_steps(self.strategy, self.global_batch, self.row_bytes, CALL_ROWS_BYTES)

    def order(self, first_epoch: int, epochs: int = 1) -> Any:
        """The orders of `epochs` epochs from `first_epoch`, one after the other, on every
        device: step s of the run they cover reads rows order[s*G : (s+1)*G]."""
        host = np.concatenate([
            epoch_order(self.seed, epoch, self.size, self.global_batch)
            for epoch in range(first_epoch, first_epoch + epochs)
        ])
        return _on_each_device(self.strategy, lambda: host)

    def describe(self) -> str:
        return f"rows kept on {each_device(self.strategy)}, gathered by index"

    def runner(self, steps: StepFunctions, start: Position, epochs: int = 1
               ) -> StepRunner:
        """Run the steps of `epochs` epochs from `start` (a checkpoint's position: its
        step of the epoch after its epochs), `count` steps per call."""
        import tensorflow as tf

        train_indexed = self.loops.get(steps, self.gather_loop)
        order = self.order(start.epoch, epochs)
        position = start.step  # the data's position: the next step of the order

        def run(count: int) -> None:
            nonlocal position
            while count > 0:
                calls = min(count, self.steps_per_call)
                train_indexed(self.rows, order, tf.constant(position, tf.int64),
                              tf.constant(calls, tf.int32))
                position += calls
                count -= calls

        return run

    def gather_loop(self, steps: StepFunctions) -> Any:
        """(rows, order, tf.int64 first step, tf.int32 count) -> None: `count` steps from
        step `first` of the order, each replica's rows of all of them gathered at once."""
        import tensorflow as tf

        strategy, global_batch = self.strategy, self.global_batch
        replicas = strategy.num_replicas_in_sync
        per_replica = global_batch // replicas

        def replica_rows(x_all: Any, y_all: Any, order: Any, first_step: Any, count: Any
                         ) -> Any:
            # This replica's rows of the call's `count` steps, gathered at once: replica r of
            # R takes rows [s*G + r*G/R, s*G + (r+1)*G/R) of the order for step s, so global
            # batch s is the same rows whatever R (the id counts every worker's replicas).
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            start = first_step * global_batch
            call = order[start : start + tf.cast(count, tf.int64) * global_batch]
            mine = tf.reshape(call, [count, replicas, per_replica])[:, replica]
            return tf.gather(x_all, mine), tf.gather(y_all, mine)

        # One gather per call, not one per step: a gather and the index arithmetic in every
        # step cost 11% of the tutorial's MLP step on a CPU (benchmarks/input_cost.py), one
        # per call ~3%. No AutoGraph: see `run_chunk`.
        @tf.function(autograph=False)
        def train_indexed(rows: Any, order: Any, first_step: Any, count: Any) -> None:
            x_all, y_all = rows
            chunk = strategy.run(replica_rows, args=(x_all, y_all, order, first_step, count))
            run_chunk(strategy, steps.replica_step, chunk, tf.constant(0), count)

        return train_indexed


def _on_each_device(strategy: Any, host_values: Callable[[], Any]) -> Any:
    """`host_values()` (numpy arrays) as tensors on each local replica's device."""
    import tensorflow as tf

    devices = strategy.extended.worker_devices

    def value_fn(context: Any) -> Any:
        # The strategy does not place these values: each goes to its replica's device here.
        # Under MultiWorkerMirroredStrategy the id counts every worker's replicas.
        with tf.device(devices[context.replica_id_in_sync_group % len(devices)]):
            return tf.nest.map_structure(tf.identity, host_values())

    return strategy.experimental_distribute_values_from_function(value_fn)


@runtime_checkable
class Feed(Protocol):
    """What the loop and bench take from any feed: the steps of an epoch (the plan's,
    `feedplan.FeedPlan.steps_per_epoch`, given to it by `make_feed`), a runner that runs
    them `count` at a time from any step of an epoch (`start`: where a checkpoint left
    the data; the steps before it are not trained, the ones after it are the order's next),
    and what the feed is, in words. Each feed wraps the replica step
    (`StepFunctions.replica_step`) in a compiled loop of its own (`training.step.loops`), as
    Keras' DataAdapters feed one step: a new feed is a class of this shape, a kind of
    `feedplan.FeedPlan` and a case in `make_feed`; no other feed and no step changes."""

    global_batch: int

    @property
    def steps_per_epoch(self) -> int: ...

    def describe(self) -> str: ...

    def runner(self, steps: StepFunctions, start: Position, epochs: int = 1
               ) -> StepRunner: ...


def make_feed(
    strategy: Any, data: Data, feed: FeedPlan, global_batch: int, seed: int, *,
    deterministic: bool = True, steps_per_call: int | None = None,
) -> Feed:
    """The feed the run's feed plan names (`feedplan.plan_feed`, decided from the data and
    the keep limit): rows kept on each device (files read whole first), streamed from host
    memory, from a loader's pipeline, or from the files; each with the plan's steps per
    epoch. `steps_per_call`: a stream's calls (default: training's)."""
    steps = feed.steps_per_epoch  # counted once, by the plan
    if feed.kind == "row_stream":
        assert isinstance(data, Streamed)
        return RowStreamFeed(strategy, data.train.rows, data.train.size, global_batch, seed,
                             deterministic, steps_per_epoch=steps)
    if feed.kind == "file_stream":
        assert isinstance(data, FileData)
        return FileStreamFeed(strategy, data, global_batch, seed, deterministic,
                              steps_per_epoch=steps)
    if isinstance(data, FileData):
        from mgpu_env.training.input.data.read import read_whole

        data = read_whole(data)
    assert isinstance(data, Arrays)
    if feed.kind == "resident":
        return ResidentFeed.place(strategy, data, global_batch, seed, steps_per_epoch=steps)
    if steps_per_call is None:
        return StreamFeed(strategy, data, global_batch, seed, deterministic,
                          steps_per_epoch=steps)
    return StreamFeed(strategy, data, global_batch, seed, deterministic,
                      steps_per_call=steps_per_call, steps_per_epoch=steps)
