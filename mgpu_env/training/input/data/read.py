"""TFRecord files and image folders through tf.data: decode, count, stream, read whole.

Everything per record runs in TensorFlow (`TFRecordDataset`, `parse_single_example`,
`decode_image`, `resize`) in parallel `map`s; Python only chooses the files.

Streaming (`worker_rows`): the files are split between workers by file when there are at
least as many files as workers (worker w reads files w, w+W, ...: the same files every
epoch, so every worker has the same number of steps each epoch), else by record (every
worker reads every file and keeps records w, w+W, ...). Each epoch takes its own order from
(SEED, epoch): the worker's files in a seeded permutation, read interleaved, then (TFRecord)
shuffled in a seeded buffer. So an epoch's batches depend only on SEED and the epoch, and a
run resumed at an epoch boundary trains on what an uninterrupted one would.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.input.data.sets import Arrays, FileData, FileKind, FilePart, Layout
from mgpu_env.training.shared.messages import plural, tensorflow_message

# Files read at once, interleaved (and the records a TFRecord stream shuffles among).
INTERLEAVE_FILES = 8
SHUFFLE_RECORDS = 10_000
READ_BATCH = 1024  # rows per tf.data batch when a data set is read whole


def _image_bytes(kind: FileKind, layout: Layout) -> Callable[..., tuple[Any, Any]]:
    """element -> (encoded or raw image bytes, int64 label)."""
    import tensorflow as tf

    if kind == "tfrecord":
        spec = {
            layout.image_feature: tf.io.FixedLenFeature([], tf.string),
            layout.label_feature: tf.io.FixedLenFeature([], tf.int64),
        }

        def parse(record: Any) -> tuple[Any, Any]:
            example = tf.io.parse_single_example(record, spec)
            return example[layout.image_feature], example[layout.label_feature]

        return parse
    return lambda path, label: (tf.io.read_file(path), tf.cast(label, tf.int64))


def _decode(layout: Layout) -> Callable[[Any], Any]:
    """Image bytes -> the image as stored (uint8, or raw float32), before any resize."""
    import tensorflow as tf

    if layout.shape is not None:
        return lambda data: tf.reshape(tf.io.decode_raw(data, tf.as_dtype(layout.dtype)),
                                       layout.shape)
    return lambda data: tf.io.decode_image(data, channels=layout.channels,
                                           expand_animations=False)


def sample_fn(kind: FileKind, layout: Layout) -> Callable[..., tuple[Any, Any]]:
    """element -> (float32 sample, int32 label): decoded, resized to `image_size` when set,
    uint8 scaled to [0, 1] (`sets.as_float32`'s rule)."""
    import tensorflow as tf

    read, decode = _image_bytes(kind, layout), _decode(layout)
    scale = 1.0 if layout.shape is not None and layout.dtype == "float32" else 1 / 255

    def sample(*element: Any) -> tuple[Any, Any]:
        data, label = read(*element)
        image = decode(data)
        if layout.image_size is not None:
            image = tf.image.resize(image, layout.image_size)
        return tf.cast(image, tf.float32) * scale, tf.cast(label, tf.int32)

    return sample


def _elements(kind: FileKind, part: FilePart, files: np.ndarray) -> Any:
    """The records of these files (indices into part.files), read interleaved, in order."""
    import tensorflow as tf

    paths = [part.files[i] for i in files]
    if kind == "images":
        labels = [(part.labels or ())[i] for i in files]
        return tf.data.Dataset.from_tensor_slices((paths, np.asarray(labels, np.int64)))
    return tf.data.Dataset.from_tensor_slices(paths).interleave(
        tf.data.TFRecordDataset, cycle_length=max(1, min(len(paths), INTERLEAVE_FILES)),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True,
    )


def by_file(part: FilePart, workers: int) -> bool:
    """Whether workers split the files (else the records)."""
    return len(part.files) >= workers


def worker_records(part: FilePart, workers: int, worker: int) -> int:
    if by_file(part, workers):
        return sum(part.counts[worker::workers])
    return (part.size - worker + workers - 1) // workers


def steps_per_epoch(part: FilePart, global_batch: int, workers: int) -> int:
    """Steps every worker can take each epoch: its share of the global batch each step,
    from its own records (a worker with more files drops its extra records)."""
    share = global_batch // workers
    return min(worker_records(part, workers, w) for w in range(workers)) // share


def worker_rows(data: FileData, seed: int, epoch: int, workers: int, worker: int) -> Any:
    """This worker's training rows of one epoch, (float32 x, int32 y), in the epoch's order."""
    import tensorflow as tf

    part = data.train
    split_files = by_file(part, workers)
    files = np.arange(len(part.files))[worker::workers] if split_files else np.arange(
        len(part.files))
    rng = np.random.default_rng([seed, epoch])
    rows = _elements(data.kind, part, rng.permutation(files))
    if not split_files and workers > 1:
        rows = rows.shard(workers, worker)
    if data.kind == "tfrecord":  # image paths are already in a whole permutation
        rows = rows.shuffle(SHUFFLE_RECORDS, seed=int(rng.integers(2**31)))
    return rows.map(sample_fn(data.kind, data.layout), num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=True)


def test_rows(data: FileData) -> Any:
    """The test rows in file order."""
    import tensorflow as tf

    rows = _elements(data.kind, data.test, np.arange(len(data.test.files)))
    return rows.map(sample_fn(data.kind, data.layout), num_parallel_calls=tf.data.AUTOTUNE)


def read_whole(data: FileData) -> Arrays:
    """Decode every record into float32 arrays (for data that fits on the device)."""
    import tensorflow as tf

    parts = []
    for part in (data.train, data.test):
        rows = _elements(data.kind, part, np.arange(len(part.files)))
        x = np.empty((part.size, *data.sample_shape), np.float32)
        y = np.empty(part.size, np.int32)
        batches = rows.map(sample_fn(data.kind, data.layout),
                           num_parallel_calls=tf.data.AUTOTUNE).batch(READ_BATCH)
        at = 0
        for xb, yb in batches.prefetch(tf.data.AUTOTUNE).as_numpy_iterator():
            x[at : at + len(yb)], y[at : at + len(yb)] = xb, yb
            at += len(yb)
        parts += [x, y]
    x_train, y_train, x_test, y_test = parts
    return Arrays(data.name, x_train, y_train, x_test, y_test, data.num_classes)


# ------------------------------------------------------------------------------- count


def count_part(where: str, kind: FileKind, part: FilePart, layout: Layout) -> dict[str, Any]:
    """Read and decode every record of a split: records per file, label range, sample
    shape. A corrupt file or image, mixed sizes, NaN: ConfigError naming the file."""
    import tensorflow as tf

    # One tf.data reduction whose state and steps are closures over the layout (its reader,
    # decoder and rank); each file's or folder's errors are judged on its results.
    read, decode = _image_bytes(kind, layout), _decode(layout)
    floating = layout.shape is not None and layout.dtype == "float32"

    def meta(*element: Any) -> tuple[Any, Any, Any]:
        data, label = read(*element)
        image = decode(data)
        bad = tf.reduce_any(~tf.math.is_finite(image)) if floating else tf.constant(False)
        return tf.shape(image), label, bad

    rank = len(layout.shape) if layout.shape is not None else 3
    big = np.iinfo(np.int32).max
    start = (tf.constant(0, tf.int64), tf.constant(np.iinfo(np.int64).max),
             tf.constant(-1, tf.int64), tf.fill([rank], big), tf.fill([rank], -1),
             tf.constant(0, tf.int64), tf.constant(-1, tf.int64))

    def add(state: Any, row: Any) -> Any:
        n, low, high, smin, smax, bad, first = state
        shape, label, nonfinite = row
        first = tf.where(nonfinite & (first < 0), n, first)
        return (n + 1, tf.minimum(low, label), tf.maximum(high, label),
                tf.minimum(smin, shape), tf.maximum(smax, shape),
                bad + tf.cast(nonfinite, tf.int64), first)

    def reduce(rows: Any, skip_errors: bool = False) -> list[Any]:
        rows = rows.map(meta, num_parallel_calls=tf.data.AUTOTUNE)
        if skip_errors:  # counted, so that the images that failed can be found after
            rows = rows.ignore_errors()
        return [np.asarray(v) for v in rows.reduce(start, add)]

    if kind == "images":
        results, counts = [_reduce_images(where, part, reduce, decode)], list(part.counts)
    else:
        results = [_reduce_records(where, path, reduce, meta) for path in part.files]
        counts = [int(result[0]) for result in results]
    smin = np.min([r[3] for r in results], axis=0)
    smax = np.max([r[4] for r in results], axis=0)
    return {"counts": counts, "min_label": int(min(r[1] for r in results)),
            "max_label": int(max(r[2] for r in results)),
            "sample_shape": _sample_shape(where, layout, smin, smax)}


def _reduce_records(where: str, path: str, reduce: Callable[..., list[Any]],
                    meta: Callable[..., Any]) -> list[Any]:
    """One TFRecord file's reduction (`count_part`'s); a file that cannot be read, holds
    non-finite values or no records: ConfigError naming it."""
    import tensorflow as tf

    try:
        result = reduce(tf.data.TFRecordDataset(path))
    except tf.errors.OpError:
        raise ConfigError(
            f"{where}: {path} cannot be read: {_bad_record(path, meta)}.\n"
            "  Fix: replace the file with a good copy, or remove it."
        ) from None
    if result[5]:
        raise ConfigError(
            f"{where}: {plural(int(result[5]), 'record')} of {path} "
            f"{'holds' if result[5] == 1 else 'hold'} NaN or infinite values "
            f"(the first is record {result[6]}); training on them gives NaN "
            "weights.\n  Fix: repair or drop those records."
        )
    if result[0] == 0:
        raise ConfigError(f"{where}: {path} holds no records. Fix: remove it.")
    return result


def _reduce_images(where: str, part: FilePart, reduce: Callable[..., list[Any]],
                   decode: Callable[[Any], Any]) -> list[Any]:
    elements = _elements("images", part, np.arange(len(part.files)))
    result = reduce(elements, True)
    broken = len(part.files) - int(result[0])
    if broken:
        first = next(path for path in part.files if not _decodes(path, decode))
        raise ConfigError(
            f"{where}: {plural(broken, 'image')} cannot be decoded (the first is {first}).\n"
            f"  Fix: replace or remove {'it' if broken == 1 else 'them'}."
        )
    return result


def _bad_record(path: str, meta: Callable[..., Any]) -> str:
    """Which record of a TFRecord file fails, and why, in words: read again one record at
    a time (on the error path only), as counting read it."""
    import tensorflow as tf

    index = 0
    try:
        for _ in tf.data.TFRecordDataset(path).map(meta):
            index += 1
    except tf.errors.DataLossError as err:
        # TFRecord's reader: "truncated record at <byte offset>" for a file that ends inside
        # a record, "corrupted record at <byte offset>" for bytes that fail their checksum.
        found = re.search(r"(truncated|corrupted) record at (\d+)", str(err))
        at = f" at byte {int(found.group(2)):,}" if found else ""
        if found and found.group(1) == "truncated":
            return f"the file is cut short: it ends inside record {index}, which starts{at}"
        return f"record {index} is corrupt{at} (its checksum does not match its bytes)"
    except tf.errors.OpError as err:
        return f"record {index} cannot be decoded ({tensorflow_message(err)})"
    return "it reads now: the file changed while it was counted"


def _decodes(path: str, decode: Callable[[Any], Any]) -> bool:
    import tensorflow as tf

    try:
        decode(tf.io.read_file(path))
    except tf.errors.OpError:
        return False
    return True


def _sample_shape(where: str, layout: Layout, smin: np.ndarray, smax: np.ndarray
                  ) -> list[int]:
    if layout.shape is not None:
        return list(layout.shape)
    if layout.image_size is None and not np.array_equal(smin, smax):
        raise ConfigError(
            f"{where}: the images have different sizes, from {tuple(smin.tolist())} to "
            f"{tuple(smax.tolist())} (height, width, channels).\n  Fix: set \"image_size\": "
            "[height, width] in dataset.json to resize them all."
        )
    if smin[-1] != smax[-1]:
        raise ConfigError(
            f"{where}: the images have from {smin[-1]} to {smax[-1]} channels.\n"
            "  Fix: set \"channels\": 1 (grey) or 3 (RGB) in dataset.json."
        )
    if layout.image_size is not None:
        return [*layout.image_size, int(smin[-1])]
    return [int(d) for d in smin]
