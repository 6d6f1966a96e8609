"""How training batches reach the step: rows kept on every device, or a tf.data stream.

Data that fits (every built-in data set: MNIST's 60,000 rows are 188 MB) is `ResidentFeed`:
the rows are copied once onto each local replica's device, and each compiled call gathers
its steps' batches from them by index (`tf.gather`), following one permutation per epoch
drawn from (SEED, epoch) on the host. No host work, no host-to-device copy and no tf.data
per step: `mgpu bench` measured the element-wise tf.data pipeline (from_tensor_slices ->
shuffle -> batch -> experimental_distribute_dataset) at 67-73% of the CPU's training
throughput.

Data that does not fit on the device (over RESIDENT_LIMIT_BYTES) is `StreamFeed`: kept in
host memory, gathered per replica batch by one tf.data pipeline per worker through
`distribute_datasets_from_function`, prefetched to each replica's device, with the tf.data
options that matter.

A `DATASET` loader's tf.data set too big to read into memory (`data.Streamed`) is
`RowStreamFeed`: its rows stream from the loader's pipeline, shuffled in a buffer.

TFRecord files and image folders (`data.FileData`) are read whole into a `ResidentFeed`
when their decoded rows fit, else `FileStreamFeed`: each worker streams its share of the
files (`data.read.worker_rows`), in an order drawn from (SEED, epoch).

The first three follow one order per epoch (the first two the same one) and give global
batch b of an epoch the same rows whatever the replica or worker count (`FileStreamFeed`'s
order is SEED's and the epoch's too, but each worker reads its own files): replica r (its id across
all workers) of R takes rows [b*G + r*G/R, b*G + (r+1)*G/R) of the epoch's order. The last
partial global batch is dropped (a different one each epoch, as the order changes), so
every step has exactly the global batch G.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mgpu_env.training.data import Arrays, Data, FileData, Streamed, as_float32

# Above this, a data set's training rows stream from the host instead of being kept on each
# device: MNIST-sized sets are 0.2 GB, a GPU this image targets has 8 GB or more, and the
# model, its activations and the optimizer need the rest.
RESIDENT_LIMIT_BYTES = 2 * 1024**3
# Rows a loader's stream shuffles among (tf.data's shuffle buffer): a stream too big for
# memory cannot be permuted whole.
STREAM_SHUFFLE_BUFFER = 10_000
# Per-replica batches each replica's device holds ready (InputOptions' default is 1).
PREFETCH_PER_REPLICA = 2
# The most bytes of rows one `train_indexed` call gathers on each device for its steps (the
# only memory a resident feed adds beyond the rows): 64 MiB is 320 of the MLP's 64-row
# batches, more than a training call's 200 steps; rows of large images get fewer per call.
CALL_ROWS_BYTES = 64 * 1024**2


def epoch_order(seed: int, epoch: int, size: int, global_batch: int) -> np.ndarray:
    """The rows of one epoch, in training order: a permutation drawn from (seed, epoch), cut
    to whole global batches. The same on every replica count and worker, and on resume."""
    steps = size // global_batch
    order = np.random.default_rng([seed, epoch]).permutation(size)[: steps * global_batch]
    # int64: TensorFlow keeps int32 tensors of a GPU in host memory, so int64 indices stay
    # on the device with the rows they index.
    return order.astype(np.int64)


def fits_on_device(data: Arrays | FileData) -> bool:
    """Whether the training rows are kept on every device (else they stream from the host),
    counted as the float32 samples and int32 labels the step takes."""
    per_row = int(np.prod(data.sample_shape)) + 1
    return data.train_size * per_row * 4 <= RESIDENT_LIMIT_BYTES


def epoch_steps(data: Data, global_batch: int, workers: int) -> int:
    """Steps per epoch: whole global batches; files streamed by file, the whole global
    batches every worker's share of the files gives."""
    if isinstance(data, FileData) and not fits_on_device(data):
        from mgpu_env.training.data.read import steps_per_epoch

        return steps_per_epoch(data.train, global_batch, workers)
    return data.train_size // global_batch


# Runs `count` more steps of the epochs a runner was made for.
StepRunner = Callable[[int], None]


@dataclass
class ResidentFeed:
    """The training rows, once on each local replica's device; batches are gathered by index
    in the compiled call (`StepFunctions.train_indexed`)."""

    strategy: Any
    rows: Any  # (x, y), each a PerReplica of the whole training set on that replica's device
    size: int
    global_batch: int
    seed: int
    row_bytes: int  # one training row, x and y

    @classmethod
    def place(cls, strategy: Any, arrays: Arrays, global_batch: int, seed: int) -> ResidentFeed:
        """Copy the training rows onto every local replica's device (one copy each)."""
        # Memory-mapped or uint8 samples (an npy folder) become float32 here, once.
        x_train = as_float32(arrays.x_train)
        rows = _on_each_device(strategy, lambda: (x_train, arrays.y_train))
        row_bytes = (x_train.nbytes + arrays.y_train.nbytes) // max(arrays.train_size, 1)
        return cls(strategy, rows, arrays.train_size, global_batch, seed, row_bytes)

    @property
    def steps_per_epoch(self) -> int:
        return self.size // self.global_batch

    @property
    def steps_per_call(self) -> int:
        """The most steps one compiled call runs: their rows, gathered at its start, stay
        within CALL_ROWS_BYTES on each device."""
        per_replica = self.global_batch // self.strategy.num_replicas_in_sync
        return max(1, CALL_ROWS_BYTES // max(per_replica * self.row_bytes, 1))

    def order(self, first_epoch: int, epochs: int = 1) -> Any:
        """The orders of `epochs` epochs from `first_epoch`, one after the other, on every
        device: step s of the run they cover reads rows order[s*G : (s+1)*G]."""
        host = np.concatenate([
            epoch_order(self.seed, epoch, self.size, self.global_batch)
            for epoch in range(first_epoch, first_epoch + epochs)
        ])
        return _on_each_device(self.strategy, lambda: host)

    def runner(self, steps: Any, first_epoch: int, epochs: int = 1) -> StepRunner:
        """Run the steps of `epochs` epochs from `first_epoch`, `count` steps per call."""
        import tensorflow as tf

        order = self.order(first_epoch, epochs)
        position = 0

        def run(count: int) -> None:
            nonlocal position
            while count > 0:
                calls = min(count, self.steps_per_call)
                steps.train_indexed(self.rows, order, tf.constant(position, tf.int64),
                                    tf.constant(calls, tf.int32))
                position += calls
                count -= calls

        return run


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


@dataclass
class StreamFeed:
    """Training rows kept in host memory, streamed to every replica's device by tf.data.

    Batches, not rows, are the stream's elements: each is one replica's part of a global
    batch, cut by index from the caller's arrays (several at once, `map`), following
    the same epoch order as `ResidentFeed`, so a run's batches (and losses) do not depend on
    whether its data fits on the device. An element-wise pipeline (from_tensor_slices ->
    shuffle -> batch) cost 71-79% of the CPU's training throughput in `mgpu bench`.
    """

    strategy: Any
    arrays: Arrays
    global_batch: int
    seed: int
    deterministic: bool = True

    @property
    def size(self) -> int:
        return self.arrays.train_size

    @property
    def steps_per_epoch(self) -> int:
        return self.size // self.global_batch

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

    def dataset(self, first_epoch: int, epochs: int = 1) -> Any:
        """`epochs` epochs from `first_epoch`, one after the other, distributed: per-replica
        batches prefetched to each replica's device."""
        import tensorflow as tf

        x_host, y_host = self.arrays.x_train, self.arrays.y_train

        def gather(rows: Any) -> tuple[Any, Any]:
            # NumPy indexing of the caller's arrays: a tensor made of them, or captured by a
            # tf.data function, would be another whole copy of data too big for a device.
            # A memory-mapped file is read only at these rows.
            return as_float32(x_host[rows]), y_host[rows]

        def cut(rows: Any) -> tuple[Any, Any]:
            x, y = tf.numpy_function(
                gather, [rows], (tf.float32, tf.as_dtype(y_host.dtype)), stateful=False,
            )
            x.set_shape((*rows.shape, *x_host.shape[1:]))
            y.set_shape(rows.shape)
            return x, y

        def per_worker(context: Any) -> Any:
            batches = self.worker_batches(
                first_epoch, epochs, context.num_input_pipelines, context.input_pipeline_id
            )
            data = tf.data.Dataset.from_tensor_slices(batches).map(
                cut, num_parallel_calls=tf.data.AUTOTUNE
            )
            return data.prefetch(tf.data.AUTOTUNE).with_options(
                stream_options(self.deterministic)
            )

        return _distribute(self.strategy, per_worker)

    def runner(self, steps: Any, first_epoch: int, epochs: int = 1) -> StepRunner:
        """Run the steps of `epochs` epochs from `first_epoch`, `count` steps per call."""
        return _iterator_runner(steps, self.dataset(first_epoch, epochs))


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


Feed = ResidentFeed | StreamFeed | RowStreamFeed | FileStreamFeed


def make_feed(
    strategy: Any, data: Data, global_batch: int, seed: int, *, deterministic: bool = True
) -> Feed:
    """The feed for this data: kept on each device when it fits, else streamed from host
    memory, or from a loader's pipeline when it was too big to read."""
    if isinstance(data, Streamed):
        return RowStreamFeed(strategy, data.train.rows, data.train.size, global_batch, seed,
                             deterministic)
    if isinstance(data, FileData):
        if not fits_on_device(data):
            return FileStreamFeed(strategy, data, global_batch, seed, deterministic)
        from mgpu_env.training.data.read import read_whole

        data = read_whole(data)
    if fits_on_device(data):
        return ResidentFeed.place(strategy, data, global_batch, seed)
    return StreamFeed(strategy, data, global_batch, seed, deterministic)
