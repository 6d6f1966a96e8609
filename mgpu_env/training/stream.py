"""The streams: training rows that are not kept on the devices, fed by tf.data.

- `StreamFeed`: arrays in host memory (or memory-mapped) too big for the devices, cut into
  chunks of many steps' batches by index, in the kept rows' order.
- `RowStreamFeed`: a `DATASET` loader's tf.data set too big to read into memory.
- `FileStreamFeed`: TFRecord files or an image folder too big to keep on the devices.

`feed.make_feed` chooses among them and the kept rows (`feed.ResidentFeed`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mgpu_env.training.data import Arrays, FileData, as_float32, take_rows
from mgpu_env.training.order import StepRunner, call_steps, epoch_order

# The most bytes of rows one `StreamFeed` chunk holds: 16 MiB is 80 of the MLP's 64-row
# batches. A stream holds ~10 chunks at its peak (being cut, prefetched on the host and on
# each device, in use): `benchmarks/stream_memory.py` measured +166 MiB of peak RSS with
# 16 MiB chunks, +309 MiB with 32 and +587 MiB with 64, for no measurable speed.
STREAM_CHUNK_BYTES = 16 * 1024**2
# Rows a loader's stream shuffles among (tf.data's shuffle buffer): a stream too big for
# memory cannot be permuted whole.
STREAM_SHUFFLE_BUFFER = 10_000
# Per-replica batches each replica's device holds ready (InputOptions' default is 1).
PREFETCH_PER_REPLICA = 2


@dataclass
class StreamFeed:
    """Training rows kept in host memory, streamed to every replica's device by tf.data.

    The stream's elements are chunks: one replica's batches of up to `steps_per_chunk`
    steps at once, cut by index from the caller's arrays (one NumPy call per chunk) and
    prefetched to the replica's device, where `StepFunctions.train_chunk` slices one batch
    per step, as `ResidentFeed`'s calls do. They follow the same epoch order as
    `ResidentFeed`, so a run's batches (and losses) do not depend on whether its data fits.

    Why chunks (digits, the seed's MLP, 2 cores shared with other work, feeds interleaved
    as in `benchmarks/input_cost.py`, % of synthetic, 1 / 2 replicas): one element per
    replica batch, cut by `tf.numpy_function` in a parallel map, pays a Python call, a
    tf.data element and a distributed-iterator step per batch: 57.0% / 64.9% (the
    design before this one, `benchmarks/stream_cost.py`, median of 3 runs). The same
    chunks `unbatch`ed back into batches inside tf.data kept that per-element cost: 53% /
    69% per CPU second. Chunks handed whole to the step: 77% / 89%
    at 32 steps, 87% / 92% at 128. A gather inside the graph (`tf.gather` in the map)
    measured the same as the NumPy cut at that size, and needs the whole data set as one
    tensor: another whole copy of data too big for a device, and a graph constant over
    protobuf's 2 GB limit. `benchmarks/stream_cost.py` at 16 MiB chunks (80 steps), median
    of 3 runs: streamed 82.9% / 86.2%, kept 87.7% / 95.1%.
    """

    strategy: Any
    arrays: Arrays
    global_batch: int
    seed: int
    # Unused: chunks are always taken in order (each replica must take chunks of one length
    # at a time), and whole chunks gain nothing from finishing out of turn.
    deterministic: bool = True

    @property
    def size(self) -> int:
        return self.arrays.train_size

    @property
    def steps_per_epoch(self) -> int:
        return self.size // self.global_batch

    @property
    def steps_per_chunk(self) -> int:
        """The most steps one chunk holds: its rows, as float32 samples and int32 labels,
        stay within STREAM_CHUNK_BYTES."""
        per_row = (int(np.prod(self.arrays.sample_shape)) + 1) * 4
        return call_steps(self.strategy, self.global_batch, per_row, STREAM_CHUNK_BYTES)

    def worker_batches(self, first_epoch: int, epochs: int, workers: int, worker: int) -> Any:
        """The row indices of this worker's per-replica batches, in the order its replicas
        take them: (batches, G/R). Per-replica batch k of the run belongs to replica k % R."""
        replicas = self.strategy.num_replicas_in_sync
        order = np.concatenate([
            epoch_order(self.seed, epoch, self.size, self.global_batch)
            for epoch in range(first_epoch, first_epoch + epochs)
        ]).reshape(-1, self.global_batch // replicas)
        owner = (np.arange(len(order)) % replicas) // (replicas // workers)
        return order[owner == worker]

    def worker_chunks(self, first_epoch: int, epochs: int, workers: int, worker: int
                      ) -> list[np.ndarray]:
        """This worker's chunks of row indices, (steps, G/R) each, in the order the stream
        hands them out: chunk c of each local replica in turn, then chunk c + 1."""
        batches = self.worker_batches(first_epoch, epochs, workers, worker)
        local = self.strategy.num_replicas_in_sync // workers
        steps = batches.reshape(-1, local, batches.shape[-1])  # (step, local replica, row)
        per_chunk = self.steps_per_chunk
        return [
            steps[first : first + per_chunk, replica]
            for first in range(0, len(steps), per_chunk) for replica in range(local)
        ]

    def dataset(self, first_epoch: int, epochs: int = 1) -> Any:
        """`epochs` epochs from `first_epoch`, one after the other, distributed: each
        replica's chunks prefetched to its device."""
        import tensorflow as tf

        x_host, y_host = self.arrays.x_train, self.arrays.y_train

        def per_worker(context: Any) -> Any:
            chunks = self.worker_chunks(
                first_epoch, epochs, context.num_input_pipelines, context.input_pipeline_id
            )

            def gather(index: Any) -> tuple[Any, Any]:
                # NumPy indexing of the caller's arrays: a tensor made of them, or captured
                # by a tf.data function, would be another whole copy of data too big for a
                # device. A memory-mapped file is read only at these rows, by `pread`: its
                # pages, mapped, would make the RSS grow by the whole file.
                rows = chunks[int(index)]
                return as_float32(take_rows(x_host, rows)), y_host[rows]

            def cut(index: Any) -> tuple[Any, Any]:
                x, y = tf.numpy_function(
                    gather, [index], (tf.float32, tf.as_dtype(y_host.dtype)), stateful=False,
                )
                batch = self.global_batch // self.strategy.num_replicas_in_sync
                x.set_shape((None, batch, *x_host.shape[1:]))  # the last chunk is shorter
                y.set_shape((None, batch))
                return x, y

            data = tf.data.Dataset.range(len(chunks)).map(
                cut, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
            )
            return data.prefetch(1).with_options(stream_options(deterministic=True))

        return _distribute(self.strategy, per_worker)

    def runner(self, steps: Any, first_epoch: int, epochs: int = 1) -> StepRunner:
        """Run the steps of `epochs` epochs from `first_epoch`, `count` steps per call: each
        call runs within one chunk, so a count that crosses chunks takes two calls."""
        import tensorflow as tf

        iterator = iter(self.dataset(first_epoch, epochs))
        total, per_chunk = self.steps_per_epoch * epochs, self.steps_per_chunk
        chunk: Any = None
        position = 0  # steps of the run taken

        def run(count: int) -> None:
            nonlocal chunk, position
            while count > 0:
                within = position % per_chunk
                if within == 0:
                    chunk = next(iterator)
                length = min(per_chunk, total - (position - within))
                calls = min(count, length - within)
                steps.train_chunk(chunk, tf.constant(within), tf.constant(calls))
                position += calls
                count -= calls

        return run


@dataclass
class RowStreamFeed:
    """A DATASET loader's rows too big to read into memory (`data.Streamed`), streamed from
    its pipeline every epoch to every replica.

    Each worker's pipeline shuffles the rows in a buffer (seeded by SEED + epoch), batches
    them per replica and keeps only its own replicas' batches, so global batch b is the
    same rows on every replica and worker count. Costlier per step than `StreamFeed`, which
    cuts whole batches from arrays: here every row passes through the shuffle buffer.
    """

    strategy: Any
    rows: Any  # tf.data.Dataset of (x, y) rows
    size: int
    global_batch: int
    seed: int
    deterministic: bool = True

    @property
    def steps_per_epoch(self) -> int:
        return self.size // self.global_batch

    def dataset(self, first_epoch: int, epochs: int = 1) -> Any:
        """`epochs` epochs from `first_epoch`, one after the other, distributed."""
        import tensorflow as tf

        replicas = self.strategy.num_replicas_in_sync
        per_replica = self.global_batch // replicas

        def per_worker(context: Any) -> Any:
            workers, worker = context.num_input_pipelines, context.input_pipeline_id
            local = replicas // workers

            def one_epoch(epoch: Any) -> Any:
                # The seed as a tensor gives the order a Python int seed + epoch gives.
                data = self.rows.shuffle(
                    STREAM_SHUFFLE_BUFFER, seed=self.seed + epoch, reshuffle_each_iteration=False
                )
                data = data.batch(per_replica, drop_remainder=True)
                data = data.take(self.steps_per_epoch * replicas)  # whole global batches
                if workers > 1:
                    # Per-replica batch k belongs to replica k % R: this worker keeps its own.
                    data = data.enumerate().filter(
                        lambda k, _: (k % replicas) // local == worker
                    ).map(lambda _, batch: batch)
                return data

            epochs_data = tf.data.Dataset.range(first_epoch, first_epoch + epochs)
            return epochs_data.flat_map(one_epoch).prefetch(tf.data.AUTOTUNE).with_options(
                stream_options(self.deterministic)
            )

        return _distribute(self.strategy, per_worker)

    def runner(self, steps: Any, first_epoch: int, epochs: int = 1) -> StepRunner:
        """Run the steps of `epochs` epochs from `first_epoch`, `count` steps per call."""
        return _iterator_runner(steps, self.dataset(first_epoch, epochs))


@dataclass
class FileStreamFeed:
    """TFRecord files or an image folder too big to keep on the devices, streamed from the
    files every epoch: each worker reads its share (`data.read.worker_rows`: by file when
    there are enough files, else by record), batches it per replica and keeps whole steps."""

    strategy: Any
    data: FileData
    global_batch: int
    seed: int
    deterministic: bool = True

    def worker_dataset(self, context: Any, first_epoch: int, epochs: int = 1) -> Any:
        """The per-replica batches of the worker `context` (a tf.distribute.InputContext)
        names, for `epochs` epochs from `first_epoch`: every worker the same whole steps."""
        import tensorflow as tf

        from mgpu_env.training.data.read import steps_per_epoch, worker_rows

        replicas = self.strategy.num_replicas_in_sync
        workers, worker = context.num_input_pipelines, context.input_pipeline_id
        steps = steps_per_epoch(self.data.train, self.global_batch, workers)
        per_epoch = [
            worker_rows(self.data, self.seed, epoch, workers, worker)
            .batch(self.global_batch // replicas, drop_remainder=True)
            .take(steps * (replicas // workers))
            for epoch in range(first_epoch, first_epoch + epochs)
        ]
        data = per_epoch[0]
        for more in per_epoch[1:]:
            data = data.concatenate(more)
        return data.prefetch(tf.data.AUTOTUNE).with_options(stream_options(self.deterministic))

    def dataset(self, first_epoch: int, epochs: int = 1) -> Any:
        """`epochs` epochs from `first_epoch`, one after the other, distributed."""
        return _distribute(
            self.strategy, lambda context: self.worker_dataset(context, first_epoch, epochs)
        )

    def runner(self, steps: Any, first_epoch: int, epochs: int = 1) -> StepRunner:
        """Run the steps of `epochs` epochs from `first_epoch`, `count` steps per call."""
        return _iterator_runner(steps, self.dataset(first_epoch, epochs))


def _distribute(strategy: Any, per_worker: Callable[[Any], Any]) -> Any:
    """One pipeline per worker, each replica's batches prefetched into its device's memory,
    off the step's critical path:
    https://www.tensorflow.org/api_docs/python/tf/distribute/InputOptions"""
    import tensorflow as tf

    return strategy.distribute_datasets_from_function(
        per_worker,
        options=tf.distribute.InputOptions(
            experimental_fetch_to_device=True,
            experimental_per_replica_buffer_size=PREFETCH_PER_REPLICA,
        ),
    )


def _iterator_runner(steps: Any, dataset: Any) -> StepRunner:
    import tensorflow as tf

    # One iterator serves every epoch: making a distributed iterator costs far more than a
    # step.
    iterator = iter(dataset)

    def run(count: int) -> None:
        steps.train_steps(iterator, tf.constant(count, tf.int32))

    return run


def stream_options(deterministic: bool) -> Any:
    """The tf.data options of a stream."""
    import tensorflow as tf

    options = tf.data.Options()
    # Each worker's pipeline already holds only its own batches (`StreamFeed.dataset`).
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # AUTOTUNE sizes the parallel stages and buffers (on by default; said so it stays on).
    options.autotune.enabled = True
    # Input work in a pool of its own, so it does not queue behind the step's ops in the
    # shared inter-op pool: https://www.tensorflow.org/api_docs/python/tf/data/ThreadingOptions
    # (0: as many threads as cores).
    options.threading.private_threadpool_size = 0
    # False lets parallel stages hand out elements as they finish: faster when elements take
    # uneven time, but the order (and so the losses) is no longer reproducible.
    options.deterministic = deterministic
    return options
