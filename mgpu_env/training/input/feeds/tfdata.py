"""What the streaming feeds share: one tf.data pipeline per worker.

The pipeline is distributed with each replica's batches prefetched to its device, and this
module holds the options every stream runs with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Per-replica batches each replica's device holds ready (InputOptions' default is 1).
PREFETCH_PER_REPLICA = 2


def distribute(strategy: Any, per_worker: Callable[[Any], Any]) -> Any:
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
