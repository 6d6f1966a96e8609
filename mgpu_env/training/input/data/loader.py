"""Your data in the packaged loop: `DATASET=package.module:function`.

The contract (also in docs/your-code.md, "Hooks"):

- **DATASET** `load()`: no arguments; returns `((x_train, y_train), (x_test, y_test))`,
  like `keras.datasets.mnist.load_data()`, of NumPy arrays (or anything `np.asarray`
  takes): `x` of shape `(N, *sample_shape)`, converted to float32 as given (scale it
  yourself), `y` integer labels `0..num_classes-1` of shape `(N,)`. Or `(train, test)` as
  two finite, **unbatched** `tf.data.Dataset`s of `(x, y)` pairs: read into memory once
  when they hold at most READ_LIMIT_BYTES, else streamed from the loader's pipeline every
  epoch (`RowStream`; one pass first counts the rows and finds the labels).
  `num_classes` is the largest label + 1. Under multi-worker, return NumPy arrays: a
  `tf.data` loader would start TensorFlow before MultiWorkerMirroredStrategy can be made.

The module is imported as MODEL's is (`step.user_code.import_hook`). Every mistake is a
ConfigError (exit 2) that says what was expected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.input.data.sets import Part, RowStream, check_finite
from mgpu_env.training.step.user_code import import_hook

DATA_CONTRACT = (
    "load() returning ((x_train, y_train), (x_test, y_test)) arrays, or (train, test) "
    "unbatched tf.data.Datasets of (x, y)"
)
# A loader's tf.data.Dataset over this many bytes is streamed, not read into memory: a
# pipeline over files may hold far more than the host's memory (training.input.keep decides, apart
# from this, which arrays stay on the devices).
READ_LIMIT_BYTES = 2 * 1024**3


def load_data(spec: str, *, setting: str = "DATASET") -> tuple[Part, Part]:
    """Call the user's loader; its train and test parts, checked: (x, y) arrays, or a
    RowStream for a tf.data.Dataset over READ_LIMIT_BYTES. Raises ConfigError."""
    load = import_hook(spec, setting, DATA_CONTRACT)
    where = f"{setting}={spec}"
    try:
        returned = load()
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(
            f"{where}: load() raised {type(err).__name__}: {err}\n"
            "  Fix: the error is in the loader (run with --debug for the traceback)."
        ) from err
    if not isinstance(returned, Sequence) or len(returned) != 2:
        raise ConfigError(
            f"{where}: load() returned {_kind(returned)}.\n  Expected: {DATA_CONTRACT}."
        )
    train = _part(where, returned[0], "train")
    test = _part(where, returned[1], "test")
    if sample_shape(train) != sample_shape(test):
        raise ConfigError(
            f"{where}: training samples have shape {sample_shape(train)} but test samples "
            f"{sample_shape(test)}.\n  Fix: give both the same sample shape."
        )
    return train, test


def sample_shape(part: Part) -> tuple[int, ...]:
    if isinstance(part, RowStream):
        return part.sample_shape
    return tuple(int(d) for d in part[0].shape[1:])


def as_stream(part: Part) -> RowStream:
    """A part as a RowStream: arrays become a tf.data.Dataset of their rows."""
    if isinstance(part, RowStream):
        return part
    import tensorflow as tf

    x, y = part
    return RowStream(tf.data.Dataset.from_tensor_slices((x, y)), int(x.shape[0]),
                     tuple(int(d) for d in x.shape[1:]), int(y.max()))


def part_max_label(part: Part) -> int:
    return part.max_label if isinstance(part, RowStream) else int(part[1].max())


def _kind(value: Any) -> str:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


def _part(where: str, part: Any, name: str) -> Part:
    if type(part).__module__.startswith("tensorflow") and hasattr(part, "element_spec"):
        read = _from_dataset(where, part, name)
        if isinstance(read, RowStream):
            return read
        x, y = read
    elif isinstance(part, Sequence) and len(part) == 2:
        try:
            x, y = np.asarray(part[0]), np.asarray(part[1])
        except Exception as err:
            raise ConfigError(
                f"{where}: the {name} part cannot be read as arrays ({err}).\n"
                f"  Expected: {DATA_CONTRACT}."
            ) from None
    else:
        raise ConfigError(
            f"{where}: the {name} part is {_kind(part)}.\n  Expected: {DATA_CONTRACT}."
        )
    return _check(where, x, y, name)


def _from_dataset(where: str, dataset: Any, name: str) -> Part:
    import tensorflow as tf

    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) != 2:
        raise ConfigError(
            f"{where}: the {name} dataset's elements are {spec}, not (x, y) pairs.\n"
            f"  Expected: {DATA_CONTRACT}."
        )
    if int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
        raise ConfigError(
            f"{where}: the {name} dataset is infinite (.repeat()?).\n"
            "  Fix: return it finite; mgpu repeats it each epoch."
        )
    if spec[0].shape.rank and spec[0].shape[0] is None:
        raise ConfigError(
            f"{where}: the {name} dataset looks batched (x has shape {spec[0].shape}).\n"
            "  Fix: return it unbatched (.unbatch()); mgpu batches by BATCH_SIZE x replicas."
        )
    size, row_bytes = int(dataset.cardinality()), _row_bytes(spec)
    # Samples of no fixed shape cannot be sized (nor batched unless they are one shape):
    # they are read, and np.stack says whether they are.
    if row_bytes is not None and (size < 0 or size * row_bytes > READ_LIMIT_BYTES):
        stream = _stream(where, dataset, name)  # its size counted, when it was unknown
        if stream.size * row_bytes > READ_LIMIT_BYTES:
            return stream
    xs, ys = [], []
    for x, y in dataset.as_numpy_iterator():
        xs.append(x)
        ys.append(y)
    if not xs:
        raise ConfigError(f"{where}: the {name} dataset is empty.")
    return np.stack(xs), np.asarray(ys)


def _row_bytes(spec: tuple[Any, Any]) -> int | None:
    """One (x, y) row's bytes as float32 and int32, when x's shape is fixed."""
    elements = spec[0].shape.num_elements()
    return None if elements is None else 4 * elements + 4


def _stream(where: str, dataset: Any, name: str) -> RowStream:
    """The dataset as a RowStream: its element spec checked, then one pass (in TensorFlow,
    not Python) counting the rows and finding the smallest and largest label."""
    import tensorflow as tf

    x_spec, y_spec = dataset.element_spec
    if not (x_spec.dtype.is_floating or x_spec.dtype.is_integer or x_spec.dtype.is_bool):
        raise ConfigError(f"{where}: x_{name} holds {x_spec.dtype.name}, not numbers.")
    if y_spec.shape not in ((), (1,)) or not y_spec.dtype.is_integer:
        raise ConfigError(
            f"{where}: the {name} dataset's labels are {y_spec.dtype.name} of shape "
            f"{y_spec.shape}; expected integer class labels of shape () (not one-hot)."
        )
    rows = dataset.map(
        lambda x, y: (tf.cast(x, tf.float32), tf.cast(tf.reshape(y, []), tf.int32)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    big = tf.int32.max
    count, low, high = rows.reduce(
        (tf.constant(0, tf.int64), tf.constant(big), tf.constant(-1)),
        lambda acc, row: (acc[0] + 1, tf.minimum(acc[1], row[1]), tf.maximum(acc[2], row[1])),
    )
    if int(count) == 0:
        raise ConfigError(f"{where}: the {name} dataset is empty.")
    if int(low) < 0:
        raise ConfigError(f"{where}: y_{name} has the label {int(low)}; labels start at 0.")
    return RowStream(rows, int(count), tuple(int(d) for d in x_spec.shape), int(high))


def _check(where: str, x: np.ndarray, y: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim < 2 or x.shape[0] == 0:
        raise ConfigError(
            f"{where}: x_{name} has shape {x.shape}; expected (N, *sample_shape) with N > 0."
        )
    if not np.issubdtype(x.dtype, np.number) and x.dtype != np.bool_:
        raise ConfigError(f"{where}: x_{name} holds {x.dtype}, not numbers.")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]  # (N, 1) labels, as Keras' CIFAR loaders return them
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise ConfigError(
            f"{where}: y_{name} has shape {y.shape} for {x.shape[0]} samples; expected "
            f"({x.shape[0]},) integer labels (not one-hot)."
        )
    whole = np.issubdtype(y.dtype, np.integer) or (
        np.issubdtype(y.dtype, np.floating) and bool(np.all(np.mod(y, 1) == 0))
    )
    if not whole:
        raise ConfigError(
            f"{where}: y_{name} holds {y.dtype}; expected integer class labels 0..N-1."
        )
    if y.min() < 0:
        raise ConfigError(f"{where}: y_{name} has the label {y.min()}; labels start at 0.")
    x = x.astype(np.float32, copy=False)
    check_finite(where, x, name)
    return x, y.astype(np.int32)


def num_classes(*parts: Part) -> int:
    """The classes the labels imply: the largest label + 1 (at least 2)."""
    return max(2, max(part_max_label(part) for part in parts) + 1)
