"""The trainer's compiled loops around the replica step (`steps.StepFunctions.replica_step`).

Separation of concerns, as Keras' trainers and orbit's runners keep it: a feed (a data
adapter, `training.input.feeds`) only says where its rows are, in order from a position (a
`Source`); the trainer wraps the one replica step in the compiled loop that reads that
source (`StepLoops.runner`). Many steps run in one `tf.function` call, as Keras'
`steps_per_execution` does, so Python runs once per call and the metrics are read once per
call. There are three kinds of source, and so three loops, whatever the kinds of data:

- `KeptRows`: every row already on each device, and the order to take them in: each call
  gathers its steps' rows by index at once (`tf.gather`);
- `Chunks`: a distributed dataset whose elements are many steps' batches at once; a call
  takes whole chunks from it, or finishes one a host-side count cut;
- `Batches`: anything whose `next()` gives per-replica batches (a distributed dataset):
  one element per step, in a `tf.range` loop.

Each loop is compiled once per `StepLoops` (a trainer's), not once per epoch or per feed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mgpu_env.training.step.steps import ReplicaStep, StepFunctions

# Runs `count` more steps of the epochs a runner was made for.
StepRunner = Callable[[int], None]


@dataclass(frozen=True)
class KeptRows:
    """Rows kept on every device: `rows` ((x, y), each a PerReplica of the whole training
    set), `order` (the rows' indices for the epochs covered, one after the other, on every
    device: step s reads order[s*G : (s+1)*G] for the global batch G), the order's step to
    start at, and the most steps one call gathers rows for (its gathered rows bound the
    memory it adds)."""

    rows: Any
    order: Any
    global_batch: int
    first_step: int
    steps_per_call: int


@dataclass(frozen=True)
class Chunks:
    """A distributed dataset whose elements are each replica's batches of several steps,
    (steps, batch, ...), and the steps of each chunk in order (the last may be shorter)."""

    dataset: Any
    lengths: list[int]


@dataclass(frozen=True)
class Batches:
    """Anything `iter()` of which gives an iterator whose `next()` is one per-replica
    batch per step: a distributed dataset, or bench's one batch reused."""

    elements: Any


Source = KeptRows | Chunks | Batches


@dataclass
class StepLoops:
    """One trainer's compiled loops: each built the first time a source of its kind is run,
    then kept for every later runner (a new `tf.function` would trace again)."""

    strategy: Any
    steps: StepFunctions
    _built: dict[str, Any] = field(default_factory=dict, repr=False)

    def runner(self, source: Source) -> StepRunner:
        """Run `count` steps per call of `source`, from its first step on."""
        if isinstance(source, KeptRows):
            return self._kept_runner(source)
        if isinstance(source, Chunks):
            return self._chunks_runner(source)
        return self._batches_runner(source)

    def _loop(self, kind: str, build: Callable[[Any, ReplicaStep], Any]) -> Any:
        if kind not in self._built:
            self._built[kind] = build(self.strategy, self.steps.replica_step)
        return self._built[kind]

    def _kept_runner(self, source: KeptRows) -> StepRunner:
        import tensorflow as tf

        train_indexed = self._loop(f"kept {source.global_batch}", lambda strategy, step:
                                   gather_loop(strategy, step, source.global_batch))
        position = source.first_step  # the order's next step

        def run(count: int) -> None:
            nonlocal position
            while count > 0:
                calls = min(count, source.steps_per_call)
                train_indexed(source.rows, source.order, tf.constant(position, tf.int64),
                              tf.constant(calls, tf.int32))
                position += calls
                count -= calls

        return run

    def _chunks_runner(self, source: Chunks) -> StepRunner:
        """Whole chunks run in one call that takes them from the stream itself
        (`train_chunks`); a count that ends inside a chunk takes that chunk to the host's
        side and runs its first steps (`train_chunk`), and the next count finishes it.
        Counts the chunks divide take only whole chunks: one call each."""
        import tensorflow as tf

        loops = self._loop("chunks", chunk_loops)
        iterator = iter(source.dataset)
        lengths = source.lengths
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

    def _batches_runner(self, source: Batches) -> StepRunner:
        import tensorflow as tf

        loop = self._loop("batches", iterator_loop)
        # One iterator serves every epoch: making a distributed iterator costs far more than
        # a step; a reused batch is its own iterator (the same object: no new trace).
        iterator = iter(source.elements)

        def run(count: int) -> None:
            loop(iterator, tf.constant(count, tf.int32))

        return run


def iterator_loop(strategy: Any, replica_step: ReplicaStep) -> Any:
    """(iterator, tf.int32 count) -> None: `count` steps, each on the iterator's next
    element (a distributed dataset's, or anything whose `next()` gives per-replica batches)."""
    import tensorflow as tf

    @tf.function
    def train_steps(iterator: Any, count: Any) -> None:
        for _ in tf.range(count):
            strategy.run(replica_step, args=next(iterator))

    return train_steps


def gather_loop(strategy: Any, replica_step: ReplicaStep, global_batch: int) -> Any:
    """(rows, order, tf.int64 first step, tf.int32 count) -> None: `count` steps from
    step `first` of the order, each replica's rows of all of them gathered at once."""
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync
    per_replica = global_batch // replicas

    def replica_rows(x_all: Any, y_all: Any, order: Any, first_step: Any, count: Any) -> Any:
        # This replica's rows of the call's `count` steps, gathered at once: replica r of R
        # takes rows [s*G + r*G/R, s*G + (r+1)*G/R) of the order for step s, so global batch
        # s is the same rows whatever R (the id counts every worker's replicas).
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
        run_chunk(strategy, replica_step, chunk, tf.constant(0), count)

    return train_indexed


@dataclass
class ChunkLoops:
    """The compiled loops of a `Chunks` source."""

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


def run_chunk(strategy: Any, replica_step: ReplicaStep, chunk: Any, first: Any, end: Any
              ) -> None:
    """Steps first..end-1 of `chunk`, (x, y) of [steps, batch, ...] on each replica: step i
    takes batch i of every replica's part. Called while a loop's compiled call traces.

    An explicit while_loop and no AutoGraph in the calls around it: converting the step's
    whole call tree (Keras included) roughly doubled the first call's tracing time, which is
    paid in epoch 1.
    """
    import tensorflow as tf

    x_chunk, y_chunk = chunk

    def replica_chunk_step(x_chunk: Any, y_chunk: Any, i: Any) -> None:
        # Slicing whole rows of the first axis shares the chunk's memory: no copy per step.
        replica_step(x_chunk[i], y_chunk[i])

    def body(i: Any) -> Any:
        strategy.run(replica_chunk_step, args=(x_chunk, y_chunk, i))
        return (i + 1,)

    tf.while_loop(lambda i: i < end, body, (first,))
