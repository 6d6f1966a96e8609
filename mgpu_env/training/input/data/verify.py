"""Which record a read failed on: the files of a split read again one at a time.

The counting pass (`files.count`) decodes every record before a folder's first run, but
later runs take the counts from the cache, keyed by the files' names, sizes and
modification times: a file damaged in place (bit rot, a bad copy that kept the mtime) is
first met during training, where TensorFlow's error names neither the file nor the record
(the files are read interleaved, in a shuffled order). `bad_records` finds them, on the
error path only: each file on its own, every record read, parsed, decoded and its label
checked, by tf.data at its own speed; records that fail are dropped (`ignore_errors`), so
the first index missing from a file's records is its first bad one. Every file of the split
is read, not only this worker's share: every worker that stops names the same files, and
the user can mend them all at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mgpu_env.training.input.data.read import sample_fn
from mgpu_env.training.input.data.sets import FileData, FilePart
from mgpu_env.training.shared.messages import tensorflow_message

# Indices of the readable records fetched from tf.data at a time.
INDEX_BATCH = 65_536

Split = Literal["train", "test"]


@dataclass(frozen=True)
class BadRecord:
    """A record that cannot be read: its file, its index in the file (None for an image,
    one file per record) and what TensorFlow said of it."""

    path: str
    record: int | None
    problem: str

    def describe(self) -> str:
        where = self.path if self.record is None else f"{self.path} record {self.record}"
        verb = "cannot be decoded" if self.record is None else "cannot be read"
        return f"{where} {verb} ({self.problem})"


def bad_records(data: FileData, split: Split = "train") -> list[BadRecord]:
    """Every file of `split` ("train" or "test") that holds a record that cannot be read:
    the first such record of each, in file order. Empty when every record reads."""
    part = data.train if split == "train" else data.test
    check = _checker(data)
    if data.kind == "images":
        return [
            BadRecord(part.files[i], None, _problem(_image_rows(part, [i]), check))
            for i in _missing(_image_rows(part, range(len(part.files))), check, len(part.files))
        ]
    found = []
    for path, count in zip(part.files, part.counts, strict=True):
        missing = _missing(_tfrecord_rows(path), check, count)
        if missing:
            first = missing[0]
            rows = _tfrecord_rows(path).skip(first).take(1)
            found.append(BadRecord(path, first, _problem(rows, check)))
    return found


def _checker(data: FileData) -> Callable[..., Any]:
    """(index, *element) -> (index, a value of the sample), the element decoded as training
    decodes it and its label checked to be a class: any failure is an error tf.data raises
    for this element."""
    import tensorflow as tf

    sample = sample_fn(data.kind, data.layout)

    def check(index: Any, *element: Any) -> Any:
        x, y = sample(*element)
        is_class = tf.debugging.Assert(
            (y >= 0) & (y < data.num_classes),
            ["label", y, f"is not a class 0..{data.num_classes - 1}"],
        )
        # A value of x, returned: Grappler drops a decode whose output only a control
        # dependency uses, and a decode error with it.
        with tf.control_dependencies([is_class]):
            return tf.identity(index), tf.reduce_max(x)

    return check


def _tfrecord_rows(path: str) -> Any:
    import tensorflow as tf

    return tf.data.TFRecordDataset(path).enumerate()


def _image_rows(part: FilePart, indices: Any) -> Any:
    import tensorflow as tf

    chosen = np.asarray(indices, np.int64)
    paths = [part.files[i] for i in chosen]
    labels = np.asarray([(part.labels or ())[i] for i in chosen], np.int64)
    return tf.data.Dataset.from_tensor_slices((chosen, paths, labels))


def _missing(rows: Any, check: Callable[..., Any], count: int) -> list[int]:
    """The indices below `count` whose element fails `check`. A TFRecord reader that meets
    a corrupt record stops there, so every index from it on is missing."""
    import tensorflow as tf

    read = rows.map(check, num_parallel_calls=tf.data.AUTOTUNE).ignore_errors()
    found = [batch for batch, _ in read.batch(INDEX_BATCH).as_numpy_iterator()]
    ok = np.zeros(count, bool)
    if found:
        indices = np.concatenate(found)
        ok[indices[indices < count]] = True
    return [int(i) for i in np.flatnonzero(~ok)]


def _problem(rows: Any, check: Callable[..., Any]) -> str:
    """What TensorFlow says when it reads these rows (which fail), on one line."""
    import tensorflow as tf

    try:
        for _ in rows.map(check):
            pass
    except tf.errors.OpError as err:
        return tensorflow_message(err)
    return "it reads now: the file changed again"


