"""`stream`: arrays in host memory too big for the devices, streamed to them in chunks.

The arrays (in memory or memory-mapped) are cut into chunks of many steps' batches by index,
in the kept rows' order, and streamed to every replica's device by tf.data
(`step.loops.Chunks`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mgpu_env.training.input.data.sets import Arrays, FileData, Streamed, float32_rows
from mgpu_env.training.input.feeds.kind import (
    Feed,
    FeedKind,
    FeedMaking,
    FeedNeed,
    FeedPlan,
    whole_batches,
)
from mgpu_env.training.input.feeds.tfdata import distribute, stream_options
from mgpu_env.training.input.order import STEPS_PER_CALL, call_steps, each_device, epoch_order
from mgpu_env.training.shared.position import Position
from mgpu_env.training.step.loops import Chunks

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


@dataclass
class StreamFeed:
    """Training rows kept in host memory, streamed to every replica's device by tf.data.

    The stream's elements are chunks: one replica's batches of up to `steps_per_chunk`
    steps at once, cut by index from the caller's arrays (one NumPy call per chunk) and
    prefetched to the replica's device, where the trainer's compiled loop
    (`step.loops.chunk_loops`) slices one batch per step, as `ResidentFeed`'s calls do.
    They follow the same epoch order as `ResidentFeed`, so a run's batches (and losses) do
    not depend on whether its data fits.

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
    stream inside the call (`step.loops.ChunkLoops.train_chunks`), so a call of 200 steps
    is one call as a kept feed's is: see STREAM_CHUNK_BYTES.

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
    steps_per_epoch: int = field(kw_only=True)  # the plan's (`registry.plan_feed`)

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

    def chunk_lengths(self, start: Position, epochs: int) -> list[int]:
        """The steps of each chunk of a run of `epochs` epochs from `start`, in order: the
        last is shorter when the run's steps are not a whole number of chunks."""
        total, per_chunk = self.steps_per_epoch * epochs - start.step, self.steps_per_chunk
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

        return distribute(self.strategy, per_worker)

    def source(self, start: Position, epochs: int = 1) -> Chunks:
        """The chunks of `epochs` epochs from `start` (a checkpoint's position): cut from
        that step on."""
        return Chunks(self.dataset(start, epochs), self.chunk_lengths(start, epochs))


def aligned_chunk(most: int, steps_per_call: int) -> int:
    """The steps of a chunk of at most `most`: all of a call's when they fit, else the largest
    divisor of the call's steps, unless that is under half of `most` (a call of 199 steps
    would make chunks of one step: chunks of `most`, and calls of up to three pieces)."""
    if steps_per_call <= most:
        return steps_per_call
    divisor = max(d for d in range(1, most + 1) if steps_per_call % d == 0)
    return divisor if 2 * divisor >= most else most


def _claims(need: FeedNeed) -> FeedPlan | None:
    """Arrays over the keep limit (files over it stream from the files: `file_stream`)."""
    if isinstance(need.data, Streamed | FileData) or need.fits:
        return None
    return FeedPlan("stream", whole_batches(need),
                    f"{need.what()} are over {need.limit()}: they stream from host memory")


def _build(made: FeedMaking) -> Feed:
    assert isinstance(made.data, Arrays)
    calls = {} if made.steps_per_call is None else {"steps_per_call": made.steps_per_call}
    return StreamFeed(made.strategy, made.data, made.global_batch, made.seed,
                      made.deterministic, steps_per_epoch=made.plan.steps_per_epoch, **calls)


KIND = FeedKind("stream", 40, _claims, _build, "streamed from host memory by tf.data")
