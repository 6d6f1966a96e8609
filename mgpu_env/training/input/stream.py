"""The streams: training rows that are not kept on the devices, fed by tf.data.

- `StreamFeed`: arrays in host memory (or memory-mapped) too big for the devices, cut into
  chunks of many steps' batches by index, in the kept rows' order.
- `RowStreamFeed`: a `DATASET` loader's tf.data set too big to read into memory.
- `FileStreamFeed`: TFRecord files or an image folder too big to keep on the devices.

`feed.make_feed` chooses among them and the kept rows (`feed.ResidentFeed`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mgpu_env.training.input.data import Arrays, FileData, float32_rows
from mgpu_env.training.input.order import (
    STEPS_PER_CALL,
    StepRunner,
    call_steps,
    each_device,
    epoch_order,
)
from mgpu_env.training.shared.messages import FILE_KIND_NOUNS
from mgpu_env.training.shared.position import Position
from mgpu_env.training.step.loops import LoopCache, iterator_loop, run_chunk
from mgpu_env.training.step.steps import ReplicaStep, StepFunctions

# The most bytes of rows one `StreamFeed` chunk holds: 64 MiB is 334 of the MLP's 64-row
# batches, so training's calls of 200 steps take one chunk each. Per CPU second the stream
# kept 91% of synthetic with chunks of 50 steps and 96-98% with chunks of 200
# (`benchmarks/input_cost.py --stream --steps 800 --lead-in 600`, one replica); peak RSS
# over 2,000 steps (`benchmarks/stream_memory.py --steps 2000`): +124 MiB with 16 MiB
# chunks, +357 MiB with 64 MiB ones and one chunk cut at a time.
STREAM_CHUNK_BYTES = 64 * 1024**2
# Chunks cut at once: one NumPy gather of a chunk takes a few percent of the time its steps
# take, so a second cutter is headroom for a slow read (a memory-mapped file), not speed.
STREAM_PARALLEL_CUTS = 2
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
    prefetched to the replica's device, where its compiled loop (`chunk_loops`) slices one
    batch per step, as `ResidentFeed`'s calls do. They follow the same epoch order as
    `ResidentFeed`, so a run's batches (and losses) do not depend on whether its data fits.

    Why chunks, and why calls of whole chunks (digits, the tutorial's MLP, 2 cores shared with
    other work, feeds interleaved as in `benchmarks/input_cost.py`, % of synthetic, 1 / 2
    replicas): one element per replica batch, cut by `tf.numpy_function` in a parallel map,
    pays a Python call, a tf.data element and a distributed-iterator step per batch: 57.0% /
    64.9% (`benchmarks/stream_cost.py`, median of 3 runs). The same chunks `unbatch`ed back
    into batches inside tf.data kept that per-element cost: 53% / 69% per CPU second. Chunks
    of 80 steps handed to the step one call each: 82.9% / 86.2%. A gather inside the graph
    (`tf.gather` in the map) measured the same as the NumPy cut, and needs the whole data set
    as one tensor: another whole copy of data too big for a device, and a graph constant
    over protobuf's 2 GB limit. Chunks that divide the caller's calls, taken from the
    stream inside the call (`ChunkLoops.train_chunks`), so a call of 200 steps is one
    call as a kept feed's is: see STREAM_CHUNK_BYTES.

    At 2 replicas on 2 cores its steps wait for a chunk 0.1-0.4% of the time (TensorFlow's
    profiler, `benchmarks/input_cost.py --profile`): what it costs more is the cuts' CPU,
    taken from a step that keeps both cores busy (at 1 replica the second core absorbs it).
    """

    strategy: Any
    arrays: Arrays
    global_batch: int
    seed: int
    # Unused: chunks are always taken in order (each replica must take chunks of one length
    # at a time), and whole chunks gain nothing from finishing out of turn.
    deterministic: bool = True
    # The steps the caller's runs ask for at once (training's calls; `mgpu bench`'s
    # intervals): chunks are cut to divide it, so a call takes whole chunks.
    steps_per_call: int = STEPS_PER_CALL
    steps_per_epoch: int = field(kw_only=True)  # the plan's (`feedplan.plan_feed`)
    loops: LoopCache[ChunkLoops] = field(default_factory=LoopCache, repr=False, compare=False)

    @property
    def size(self) -> int:
        return self.arrays.train_size

    def describe(self) -> str:
        return (f"rows in host memory, streamed to {each_device(self.strategy)} by tf.data "
                f"in chunks of {self.steps_per_chunk} steps")

    @property
    def steps_per_chunk(self) -> int:
        """The steps one chunk holds: its rows, as float32 samples and int32 labels, stay
        within STREAM_CHUNK_BYTES, and divide `steps_per_call` where that costs at most
        half of them."""
        per_row = (int(np.prod(self.arrays.sample_shape)) + 1) * 4
        most = call_steps(self.strategy, self.global_batch, per_row, STREAM_CHUNK_BYTES)
        return aligned_chunk(most, self.steps_per_call)

    def chunk_lengths(self, epochs: int, first_step: int = 0) -> list[int]:
        """The steps of each chunk of a run of `epochs` epochs from step `first_step`, in
        order: the last is shorter when the run's steps are not a whole number of chunks."""
        total, per_chunk = self.steps_per_epoch * epochs - first_step, self.steps_per_chunk
        return [min(per_chunk, total - first) for first in range(0, total, per_chunk)]

    def worker_batches(self, start: Position, epochs: int, workers: int, worker: int
                       ) -> Any:
        """The row indices of this worker's per-replica batches, in the order its replicas
        take them, from `start`: (batches, G/R). Per-replica batch
        k of the run belongs to replica k % R."""
        replicas = self.strategy.num_replicas_in_sync
        order = np.concatenate([
            epoch_order(self.seed, epoch, self.size, self.global_batch)
            for epoch in range(start.epoch, start.epoch + epochs)
        ])[start.step * self.global_batch :].reshape(-1, self.global_batch // replicas)
        owner = (np.arange(len(order)) % replicas) // (replicas // workers)
        return order[owner == worker]

    def worker_chunks(self, start: Position, epochs: int, workers: int, worker: int
                      ) -> list[np.ndarray]:
        """This worker's chunks of row indices, (steps, G/R) each, in the order the stream
        hands them out: chunk c of each local replica in turn, then chunk c + 1."""
        batches = self.worker_batches(start, epochs, workers, worker)
        local = self.strategy.num_replicas_in_sync // workers
        steps = batches.reshape(-1, local, batches.shape[-1])  # (step, local replica, row)
        per_chunk = self.steps_per_chunk
        return [
            steps[first : first + per_chunk, replica]
            for first in range(0, len(steps), per_chunk) for replica in range(local)
        ]

    def dataset(self, start: Position, epochs: int = 1) -> Any:
        """`epochs` epochs from `start`, one after the other,
        distributed: each replica's chunks prefetched to its device."""
        import tensorflow as tf

        x_host, y_host = self.arrays.x_train, self.arrays.y_train

        def per_worker(context: Any) -> Any:
            chunks = self.worker_chunks(
                start, epochs, context.num_input_pipelines, context.input_pipeline_id)

            def gather(index: Any) -> tuple[Any, Any]:
                # NumPy indexing of the caller's arrays: a tensor made of them, or captured
                # by a tf.data function, would be another whole copy of data too big for a
                # device. A memory-mapped file is read only at these rows, by `pread`: its
                # pages, mapped, would make the RSS grow by the whole file.
                rows = chunks[int(index)]
                return float32_rows(x_host, rows), y_host[rows]

            def cut(index: Any) -> tuple[Any, Any]:
                x, y = tf.numpy_function(
                    gather, [index], (tf.float32, tf.as_dtype(y_host.dtype)), stateful=False,
                )
                batch = self.global_batch // self.strategy.num_replicas_in_sync
                x.set_shape((None, batch, *x_host.shape[1:]))  # the last chunk is shorter
                y.set_shape((None, batch))
                return x, y

            data = tf.data.Dataset.range(len(chunks)).map(
                cut, num_parallel_calls=STREAM_PARALLEL_CUTS, deterministic=True
            )
            return data.prefetch(1).with_options(stream_options(deterministic=True))

        return _distribute(self.strategy, per_worker)

    def runner(self, steps: StepFunctions, start: Position, epochs: int = 1
               ) -> StepRunner:
        """Run the steps of `epochs` epochs from `start` (a checkpoint's position), `count`
        steps per call: the chunks are cut from that step on.

        Whole chunks run in one call that takes them from the stream itself
        (`train_chunks`); a count that ends inside a chunk takes that chunk to the host's
        side and runs its first steps (`train_chunk`), and the next count finishes it.
        Counts of `steps_per_call` take only whole chunks: one call each.
        """
        import tensorflow as tf

        strategy = self.strategy
        loops = self.loops.get(steps, lambda s: chunk_loops(strategy, s.replica_step))
        iterator = iter(self.dataset(start, epochs))
        lengths = self.chunk_lengths(epochs, start.step)
        taken = 0  # chunks taken from the stream
        held: Any = None  # a chunk begun by an earlier count
        held_done = held_left = 0

        def run(count: int) -> None:
            nonlocal taken, held, held_done, held_left
            while count > 0:
                if held_left:
                    calls = min(count, held_left)
                    loops.train_chunk(held, tf.constant(held_done), tf.constant(calls))
                    held_done, held_left = held_done + calls, held_left - calls
                    count -= calls
                    continue
                whole = covered = 0
                while taken + whole < len(lengths) and covered + lengths[taken + whole] <= count:
                    covered += lengths[taken + whole]
                    whole += 1
                if whole:
                    loops.train_chunks(iterator, tf.constant(whole))
                    taken, count = taken + whole, count - covered
                    continue
                held, held_done, held_left = next(iterator), 0, lengths[taken]
                taken += 1

        return run


@dataclass
class ChunkLoops:
    """`StreamFeed`'s compiled loops around the replica step."""

    train_chunk: Any  # ((x, y) of [steps, batch, ...] per replica, tf.int32 first, count) -> None
    train_chunks: Any  # (distributed iterator of such chunks, tf.int32 chunk count) -> None


def chunk_loops(strategy: Any, replica_step: ReplicaStep) -> ChunkLoops:
    """`train_chunk(chunk, first, count)` runs steps first..first+count-1 of a chunk the host
    holds; `train_chunks(iterator, k)` runs k whole chunks taken from the stream in the call."""
    import tensorflow as tf

    # A streamed chunk's last one may hold fewer steps: one more trace, then a shape that
    # takes any step count.
    @tf.function(autograph=False, reduce_retracing=True)
    def train_chunk(chunk: Any, first: Any, count: Any) -> None:
        run_chunk(strategy, replica_step, chunk, first, first + count)

    # Whole chunks taken from the stream inside the call: a call of many chunks' steps is one
    # call, as a kept feed's is. Each call from Python costs about as much as a few steps of
    # the MLP, so a call per chunk kept the stream near 83-86% of synthetic where aligned
    # whole-chunk calls reach 93-98% (`benchmarks/input_cost.py --stream`).
    @tf.function(autograph=False)
    def train_chunks(iterator: Any, chunks: Any) -> None:
        def body(c: Any) -> Any:
            chunk = next(iterator)
            # Every replica's chunk holds the same steps; the last one of a run fewer.
            length = tf.shape(strategy.experimental_local_results(chunk[0])[0])[0]
            run_chunk(strategy, replica_step, chunk, tf.constant(0), length)
            return (c + 1,)

        tf.while_loop(lambda c: c < chunks, body, (tf.constant(0),))

    return ChunkLoops(train_chunk, train_chunks)


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
    steps_per_epoch: int = field(kw_only=True)  # the plan's (`feedplan.plan_feed`)
    loops: LoopCache[Any] = field(default_factory=LoopCache, repr=False, compare=False)

    def describe(self) -> str:
        return (f"a loader's rows, streamed from its pipeline to {each_device(self.strategy)} "
                f"by tf.data, shuffled among {STREAM_SHUFFLE_BUFFER:,}")

    def dataset(self, start: Position, epochs: int = 1) -> Any:
        """`epochs` epochs from `start`, one after the other,
        distributed."""
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

            epochs_data = tf.data.Dataset.range(start.epoch, start.epoch + epochs)
            # The data's position: the steps before `start.step` pass through the shuffle
            # buffer untrained, so the ones after are the order's (when it is deterministic).
            data = epochs_data.flat_map(one_epoch).skip(start.step * local)
            return data.prefetch(tf.data.AUTOTUNE).with_options(
                stream_options(self.deterministic)
            )

        return _distribute(self.strategy, per_worker)

    def runner(self, steps: StepFunctions, start: Position, epochs: int = 1
               ) -> StepRunner:
        """Run the steps of `epochs` epochs from `start` (a checkpoint's position), `count`
        steps per call."""
        loop = self.loops.get(steps, lambda s: iterator_loop(self.strategy, s.replica_step))
        return iterator_runner(loop, self.dataset(start, epochs))


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
    # The plan's: the whole global batches every worker's share of the files gives.
    steps_per_epoch: int = field(kw_only=True)
    loops: LoopCache[Any] = field(default_factory=LoopCache, repr=False, compare=False)

    def describe(self) -> str:
        return (f"{FILE_KIND_NOUNS[self.data.kind]} in {self.data.folder}, streamed to "
                f"{each_device(self.strategy)} by tf.data, each worker its share")

    def worker_dataset(self, context: Any, start: Position, epochs: int = 1) -> Any:
        """The per-replica batches of the worker `context` (a tf.distribute.InputContext)
        names, for `epochs` epochs from `start`: every worker the
        same whole steps."""
        import tensorflow as tf

        from mgpu_env.training.input.data.read import worker_rows

        replicas = self.strategy.num_replicas_in_sync
        workers, worker = context.num_input_pipelines, context.input_pipeline_id
        steps = self.steps_per_epoch
        per_epoch = [
            worker_rows(self.data, self.seed, epoch, workers, worker)
            .batch(self.global_batch // replicas, drop_remainder=True)
            .take(steps * (replicas // workers))
            for epoch in range(start.epoch, start.epoch + epochs)
        ]
        data = per_epoch[0]
        for more in per_epoch[1:]:
            data = data.concatenate(more)
        # The data's position: the files' records before `start.step` are read, not trained.
        data = data.skip(start.step * (replicas // workers))
        return data.prefetch(tf.data.AUTOTUNE).with_options(stream_options(self.deterministic))

    def dataset(self, start: Position, epochs: int = 1) -> Any:
        """`epochs` epochs from `start`, one after the other,
        distributed."""
        return _distribute(self.strategy, lambda context: self.worker_dataset(
            context, start, epochs))

    def runner(self, steps: StepFunctions, start: Position, epochs: int = 1
               ) -> StepRunner:
        """Run the steps of `epochs` epochs from `start` (a checkpoint's position), `count`
        steps per call."""
        loop = self.loops.get(steps, lambda s: iterator_loop(self.strategy, s.replica_step))
        return iterator_runner(loop, self.dataset(start, epochs))


def aligned_chunk(most: int, steps_per_call: int) -> int:
    """The steps of a chunk of at most `most`: all of a call's when they fit, else the largest
    divisor of the call's steps, unless that is under half of `most` (a call of 199 steps
    would make chunks of one step: chunks of `most`, and calls of up to three pieces)."""
    if steps_per_call <= most:
        return steps_per_call
    divisor = max(d for d in range(1, most + 1) if steps_per_call % d == 0)
    return divisor if 2 * divisor >= most else most


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


def iterator_runner(loop: Any, dataset: Any) -> StepRunner:
    """Run `count` steps per call of an `iterator_loop`, over one iterator of `dataset`."""
    import tensorflow as tf

    # One iterator serves every epoch: making a distributed iterator costs far more than a
    # step.
    iterator = iter(dataset)

    def run(count: int) -> None:
        loop(iterator, tf.constant(count, tf.int32))

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
