"""The compiled loops feeds build around the replica step (`steps.StepFunctions.replica_step`).

A feed runs many steps in one `tf.function` call, as Keras' `steps_per_execution` does, so
Python runs once per call and the metrics are read once per call. The loops here are the
pieces feeds share: steps over an iterator (`iterator_loop`, a `tf.range` loop), and steps
sliced from a chunk of batches already on each device (`run_chunk`, inside a feed's own
compiled call). Each feed builds its loops once (`LoopCache`), not once per epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mgpu_env.training.step.steps import ReplicaStep, StepFunctions

Loop = TypeVar("Loop")


@dataclass
class LoopCache(Generic[Loop]):
    """A feed's compiled loop, built for the step functions its first runner is given and
    kept for the next runners (one per epoch): a new `tf.function` would trace again."""

    steps: StepFunctions | None = None
    loop: Loop | None = None

    def get(self, steps: StepFunctions, build: Callable[[StepFunctions], Loop]) -> Loop:
        """The loop built for `steps`, built now by `build(steps)` when it is not yet."""
        if self.loop is None or self.steps is not steps:
            self.steps, self.loop = steps, build(steps)
        return self.loop


def iterator_loop(strategy: Any, replica_step: ReplicaStep) -> Any:
    """(iterator, tf.int32 count) -> None: `count` steps, each on the iterator's next
    element (a distributed dataset's, or anything whose `next()` gives per-replica batches)."""
    import tensorflow as tf

    @tf.function
    def train_steps(iterator: Any, count: Any) -> None:
        for _ in tf.range(count):
            strategy.run(replica_step, args=next(iterator))

    return train_steps


def run_chunk(strategy: Any, replica_step: ReplicaStep, chunk: Any, first: Any, end: Any
              ) -> None:
    """Steps first..end-1 of `chunk`, (x, y) of [steps, batch, ...] on each replica: step i
    takes batch i of every replica's part. Called while a feed's compiled call traces.

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
