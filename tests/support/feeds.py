"""The rows a feed hands to the step: each kind of feed (kept, streamed from arrays, a
loader's rows) run with a step that only counts which rows it was given, so a test reads the
global batches themselves rather than a loss computed from them."""

from __future__ import annotations

from typing import Any

import numpy as np


def rows_seen(strategy: Any, feed_kind: str, size: int, global_batch: int,
              spans: list[tuple[int, int]]) -> list[np.ndarray]:
    """For each (first_step, steps): how often each row was trained on by a runner of epoch 1
    started at first_step and run that many steps (a fresh count each)."""
    import tensorflow as tf

    from mgpu_env.training.input.data import Arrays
    from mgpu_env.training.input.feeds import ResidentFeed, RowStreamFeed, StreamFeed
    from mgpu_env.training.shared.position import Position
    from mgpu_env.training.step.loops import StepLoops
    from mgpu_env.training.step.steps import StepFunctions

    x = np.stack([np.arange(size, dtype=np.float32)] * 4, axis=1)  # column 0: the row
    y = (np.arange(size) % 10).astype(np.int32)
    with strategy.scope():
        counts = tf.Variable(tf.zeros([size]), synchronization=tf.VariableSynchronization.ON_READ,
                             aggregation=tf.VariableAggregation.SUM)

    def count_rows(x_batch: Any, y_batch: Any) -> None:
        rows = tf.cast(x_batch[:, 0], tf.int32)
        counts.assign_add(tf.math.bincount(rows, minlength=size, maxlength=size,
                                           dtype=tf.float32))

    steps = StepFunctions(count_rows, None, None, None, None, None, None)
    arrays = Arrays("test", x, y, x[:10], y[:10])
    per_epoch = size // global_batch  # the plan's count: whole global batches
    feed: Any = (
        ResidentFeed.place(strategy, arrays, global_batch, seed=3, steps_per_epoch=per_epoch)
        if feed_kind == "resident"
        else StreamFeed(strategy, arrays, global_batch, seed=3, steps_per_call=4,
                        steps_per_epoch=per_epoch)
        if feed_kind == "stream"
        else RowStreamFeed(strategy, tf.data.Dataset.from_tensor_slices((x, y)), size,
                           global_batch, seed=3, steps_per_epoch=per_epoch)
    )
    loops = StepLoops(strategy, steps)
    seen = []
    for first, count in spans:
        counts.assign(tf.zeros([size]))
        loops.runner(feed.source(Position(1, first)))(count)
        seen.append(counts.read_value().numpy())
    return seen
