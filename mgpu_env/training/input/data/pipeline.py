"""The test set as a tf.data pipeline, in global batches, for evaluation."""

from __future__ import annotations

from typing import Any

import numpy as np

from mgpu_env.training.input.data.sets import Data, FileData, Streamed, as_float32, release_pages


def _distribute_options() -> Any:
    import tensorflow as tf

    options = tf.data.Options()
    # Test data is split between workers by element, not by file: shard by DATA (each
    # worker keeps every n-th batch). The default AUTO would try FILE, fail, and fall back
    # with a warning; with one worker the policy changes nothing.
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    return options


def test_dataset(data: Data, global_batch_size: int) -> Any:
    """The whole test set in global batches; the last, partial batch is kept."""
    import tensorflow as tf

    if isinstance(data, FileData):
        from mgpu_env.training.input.data.read import test_rows

        batches = test_rows(data).batch(global_batch_size)
    elif isinstance(data, Streamed):
        from mgpu_env.training.input.data.loader import as_stream

        batches = as_stream(data.test).rows.batch(global_batch_size)  # too big to cache
    elif isinstance(data.x_test, np.memmap) or data.x_test.dtype != np.float32:
        batches = _mapped_batches(data.x_test, data.y_test, global_batch_size)
    else:
        rows = tf.data.Dataset.from_tensor_slices((data.x_test, data.y_test)).cache()
        batches = rows.batch(global_batch_size)
    return batches.prefetch(tf.data.AUTOTUNE).with_options(_distribute_options())


def _mapped_batches(x: np.ndarray, y: np.ndarray, batch: int) -> Any:
    """Batches read from memory-mapped samples one at a time, never the whole file."""
    import tensorflow as tf

    def read(start: Any) -> tuple[np.ndarray, np.ndarray]:
        rows = as_float32(x[start : start + batch]), y[start : start + batch]
        release_pages(x)  # else the whole file stays in the RSS once evaluated
        return rows

    def cut(start: Any) -> tuple[Any, Any]:
        xb, yb = tf.numpy_function(read, [start], (tf.float32, tf.int32), stateful=False)
        xb.set_shape((None, *x.shape[1:]))
        yb.set_shape((None,))
        return xb, yb

    return tf.data.Dataset.range(0, x.shape[0], batch).map(cut)
