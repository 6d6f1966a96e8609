"""What a run trains on, as types: the choice of data set, and its data once loaded.

`Arrays` (in memory, or memory-mapped `.npy` files), `Streamed` (a loader's tf.data set too
big to read), `FileData` (TFRecord files or image folders, read by tf.data). Every
`training.input.feeds` takes any of them.
"""

from __future__ import annotations

import functools
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.shared.messages import FILE_KIND_NOUNS
from mgpu_env.training.shared.shapes import (  # noqa: F401  (the data's names for them)
    CLASSES,
    FEATURES,
    IMAGE_SIDE,
)

# Rows checked for NaN and infinity at a time: a bounded temporary, whatever the data's size.
FINITE_CHUNK_ROWS = 65_536

Origin = Literal["file", "download", "built-in", "generated", "hook", "files"]


# A DATASET loader's parts (`training.step.user_code`): arrays, or a stream of rows too big to read.
@dataclass(frozen=True)
class RowStream:
    """A loader's tf.data.Dataset too big to read into memory: its rows as (float32 x,
    int32 y), read anew each epoch, with what one counting pass found."""

    rows: Any  # tf.data.Dataset of (x, y)
    size: int
    sample_shape: tuple[int, ...]
    max_label: int


Part = tuple[np.ndarray, np.ndarray] | RowStream


def part_size(part: Part) -> int:
    return part.size if isinstance(part, RowStream) else int(part[0].shape[0])
FileKind = Literal["tfrecord", "images", "npy"]
FILE_KINDS: tuple[FileKind, ...] = ("tfrecord", "images", "npy")


@dataclass(frozen=True)
class DatasetChoice:
    """Which data set a run uses and where it comes from; decided without TensorFlow."""

    name: str  # mnist, digits, synthetic, fashion_mnist, package.module:function, kind:DIR
    origin: Origin
    location: Path | None = None  # the file or folder read, or where a download goes
    note: str | None = None  # why auto chose this one, for the start summary

    def describe(self) -> str:
        if self.origin == "hook":
            return f"{self.name} (your loader)"
        if self.origin == "files":
            return f"{FILE_KIND_NOUNS[self.name.split(':', 1)[0]]} in {self.location}"
        if self.origin == "file":
            return f"{self.name} from {self.location}"
        if self.origin == "download":
            return f"{self.name}, downloaded (if not yet) to {self.location}"
        if self.origin == "built-in":
            return f"{self.name} (built into scikit-learn, offline)"
        return f"{self.name} (random, generated)"


@dataclass(frozen=True)
class Arrays:
    """A loaded data set: samples (built-in: float32 rows of 784 values in [0, 1]; a `.npy`
    folder's: memory-mapped as stored, made float32 by `as_float32` where they are read) and
    int32 labels 0..num_classes-1."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int = CLASSES

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def train_size(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def test_size(self) -> int:
        return int(self.x_test.shape[0])


@dataclass(frozen=True)
class Streamed:
    """A DATASET loader's data too big to read into memory (`RowStream`): the
    training rows stream from its pipeline every epoch (`training.input.feeds.RowStreamFeed`), the
    test rows once per evaluation."""

    name: str
    train: RowStream
    test: Part  # a RowStream, or (x, y) arrays when the test part was small
    num_classes: int

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.train.sample_shape

    @property
    def train_size(self) -> int:
        return self.train.size

    @property
    def test_size(self) -> int:
        return part_size(self.test)


@dataclass(frozen=True)
class FilePart:
    """One split of a file data set: its files, the records in each, and (image folders)
    each file's label."""

    files: tuple[str, ...]  # absolute paths, sorted
    counts: tuple[int, ...]  # records per file (1 per image)
    labels: tuple[int, ...] | None = None  # image folders: the class of each file

    @property
    def size(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class Layout:
    """How a folder's records are read: `DIR/dataset.json`, every key optional."""

    image_feature: str = "image"  # TFRecord: the bytes feature of the image
    label_feature: str = "label"  # TFRecord: the int64 feature of the class
    shape: tuple[int, ...] | None = None  # TFRecord: raw (not encoded) images of this shape
    dtype: str = "uint8"  # TFRecord raw images: uint8 or float32
    image_size: tuple[int, int] | None = None  # resize every image to (height, width)
    channels: int = 0  # decode to 1 (grey), 3 (RGB) or 4 channels; 0: as stored
    classes: int | None = None  # labels run 0..classes-1; default: the largest label + 1


@dataclass(frozen=True)
class FileData:
    """TFRecord files or an image folder, counted and checked (`data.files`): read whole
    into the kept feed when the decoded rows fit on the device, else streamed by file."""

    name: str
    kind: FileKind
    folder: Path
    layout: Layout
    train: FilePart
    test: FilePart
    sample_shape: tuple[int, ...]
    num_classes: int

    @property
    def train_size(self) -> int:
        return self.train.size

    @property
    def test_size(self) -> int:
        return self.test.size


# What a run trains on: arrays in memory, a loader's streams, or files.
Data = Arrays | Streamed | FileData


@dataclass(frozen=True)
class DataSizes:
    """What a run knows of its data's size and shape: a built-in set's before it is read
    (its official sizes), a loader's or a folder's once it is loaded (`DataSizes.of`)."""

    train_size: int
    test_size: int
    sample_shape: tuple[int, ...] = (FEATURES,)
    num_classes: int = CLASSES

    @classmethod
    def of(cls, data: Data) -> DataSizes:
        return cls(data.train_size, data.test_size, data.sample_shape, data.num_classes)


def as_float32(x: np.ndarray) -> np.ndarray:
    """Samples as the model takes them: uint8 (image bytes) scaled to [0, 1], as the built-in
    MNIST is; any other type as it is, converted to float32."""
    if x.dtype == np.uint8:
        return (np.asarray(x, dtype=np.float32) / 255.0).astype(np.float32, copy=False)
    return np.asarray(x, dtype=np.float32)


def take_rows(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`x[rows]` (`rows`: integer indices of any shape). From a memory-mapped `.npy` file
    (`np.load(mmap_mode="r")`), read with one `os.pread` per row, in file order, so the
    file's pages never become this process's memory; from any other array, NumPy's indexing.
    The file is opened by its path for each call, as the TFRecord stream opens its files.

    Why not index the map: every page of a file mapping that is read stays counted in the
    process's RSS (RssFile) until the kernel wants the memory back, and a kernel that keeps
    files in large folios (Linux 6.18 on ext4 here) maps up to 2 MiB per row read: an epoch
    of a 5 GiB file's rows in random order made the peak RSS 5.3 GiB over the baseline,
    with `pread` 0.17 GiB (`benchmarks/data_memory.py`); a container's or Slurm job's
    memory limit counts it against the run. Releasing the pages after each chunk
    (MADV_DONTNEED) does not bound it: one chunk's 5,120 rows mapped 2.4 GiB of a 2.5 GiB
    file. The cost: 5,120 rows of 784 bytes take 4-8 ms by `pread`, 3-5 ms through the map.
    """
    mapped = _whole_map(x)
    if mapped is None:
        return np.asarray(x[rows])
    path = str(mapped.filename)
    flat = np.asarray(rows, np.int64).ravel()
    order = np.argsort(flat)  # in file order: about 30% faster than as asked
    row_bytes = x.strides[0]
    offsets = (flat[order] * row_bytes + mapped.offset).tolist()
    fd = os.open(path, os.O_RDONLY)
    try:
        data = b"".join(map(functools.partial(os.pread, fd, row_bytes), offsets))
    finally:
        os.close(fd)
    if len(data) != row_bytes * len(flat):
        raise OSError(f"{path} is shorter than its .npy header says: the file changed")
    out = np.empty((len(flat), *x.shape[1:]), x.dtype)
    out[order] = np.frombuffer(data, x.dtype).reshape(out.shape)
    return out.reshape(*np.shape(rows), *x.shape[1:])


# TensorFlow takes a NumPy array's memory as a tensor's only when it starts on this boundary
# (its EIGEN_MAX_ALIGN_BYTES); it copies any other whole, `tf.numpy_function`'s results too.
TENSOR_ALIGN_BYTES = 64


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array whose data starts on TENSOR_ALIGN_BYTES (NumPy's own start
    on 16)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + TENSOR_ALIGN_BYTES, np.uint8)
    start = -raw.ctypes.data % TENSOR_ALIGN_BYTES
    return raw[start:start + size].view(dtype).reshape(shape)


def float32_rows(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`as_float32(take_rows(x, rows))`, the same values, written into `aligned_empty`
    memory: a stream's chunk then becomes a tensor without a second copy. A chunk of 12,800
    rows of 784 float32 (40 MB) in a `tf.numpy_function`: 7-12 ms cut by indexing (TensorFlow
    copying it 3-6 ms of that), 5-10 ms taken into aligned memory."""
    out = aligned_empty((*np.shape(rows), *x.shape[1:]), np.float32)
    if x.dtype == np.float32 and _whole_map(x) is None:
        # mode="clip": with "raise" NumPy writes to a buffer first; the rows are x's already.
        np.take(x, np.ravel(rows), axis=0, out=out.reshape(-1, *x.shape[1:]), mode="clip")
    else:
        out[...] = as_float32(take_rows(x, rows))
    return out


def release_pages(x: np.ndarray) -> None:
    """Drop the pages of a memory-mapped `.npy` file that this process has read from its
    resident memory (a no-op for any other array): after reading the whole file, or each
    part of it in turn, so it does not stay in the RSS (`take_rows` says why that matters).
    They stay in the page cache: a page read again costs a minor fault, not a disk read."""
    mapped = _whole_map(x)
    if mapped is not None and isinstance(mapped.base, mmap.mmap):
        mapped.base.madvise(mmap.MADV_DONTNEED)


def _whole_map(x: np.ndarray) -> np.memmap | None:
    """`x` when it is an `np.memmap` of a whole file's C-ordered array, its rows one after
    the other from `offset` (not a view, which shares the file but not the offset)."""
    if not isinstance(x, np.memmap) or not isinstance(x.base, mmap.mmap):
        return None
    return x if x.flags.c_contiguous and x.filename else None


def check_finite(where: str, x: np.ndarray, part: str) -> None:
    """Refuse NaN or infinite samples (ConfigError): a single NaN trains the model into NaN
    weights and chance accuracy without any error. Read in chunks, so a memory-mapped file is
    never read whole at once."""
    if not np.issubdtype(x.dtype, np.floating) or x.shape[0] == 0:
        return  # integers cannot be NaN
    bad, first = 0, -1
    for start in range(0, x.shape[0], FINITE_CHUNK_ROWS):
        chunk = np.asarray(x[start : start + FINITE_CHUNK_ROWS])
        release_pages(x)  # read once: a whole file would stay in this process's RSS
        rows = ~np.isfinite(chunk.reshape(chunk.shape[0], -1)).all(axis=1)
        if rows.any():
            if first < 0:
                first = start + int(np.argmax(rows))
            bad += int(rows.sum())
    if bad:
        raise ConfigError(
            f"{where}: {bad} of the {x.shape[0]} {part} samples hold NaN or infinite values "
            f"(the first is row {first}); training on them gives NaN weights.\n"
            "  Fix: drop or repair those rows (e.g. np.nan_to_num), then run again."
        )
