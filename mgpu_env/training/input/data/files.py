"""Folders of files as data sets: `DATASET=tfrecord:DIR`, `images:DIR`, `npy:DIR`.

Layouts (the splits are `train` and `test`; both must be there):
- `tfrecord:DIR`: files in DIR whose names hold `.tfrecord` (or end in `.tfrec`) and
  `train` or `test`, TFDS's `mnist-train.tfrecord-00000-of-00004` for one; each record a
  `tf.train.Example` with an `image` bytes feature (PNG/JPEG/GIF/BMP, or raw bytes of the
  `shape` that `DIR/dataset.json` gives) and an int64 `label`.
- `images:DIR`: `DIR/train/<class>/*.png|jpg|jpeg|gif|bmp` and `DIR/test/<class>/...`;
  the classes are the training folder's subfolders in sorted order (Keras'
  `image_dataset_from_directory` convention).
- `npy:DIR`: `x_train.npy`, `y_train.npy`, `x_test.npy`, `y_test.npy`, memory-mapped.

`DIR/dataset.json` (optional) says how to read them: `image_feature`, `label_feature`,
`shape` and `dtype` (raw TFRecord images), `image_size` ([height, width]: resize every image;
needed when sizes differ), `channels`, `classes`.

Counting is done once: the first run reads every record (decoding each image, so a corrupt
one, a label out of range, mixed sizes, NaN in float samples are refused before training,
exit 2) and writes what it found to `DIR/.mgpu-dataset.json` (or, when DIR is read-only,
to the user's cache folder), keyed by the files' names, sizes and modification times and by
dataset.json. Later runs, and `mgpu train --dry-run`, read that instead.

How they train: `.npy` samples stay memory-mapped (`data.Arrays`): the kept feed copies them
to each device when they fit, else the host stream reads each chunk's rows from the file
(`sets.take_rows`: by `pread`, so the file's pages do not pile up in the process's RSS).
TFRecord and image folders become `data.FileData`: read whole into the kept feed when the
decoded float32 rows fit on the device, else streamed from the files every epoch
(`data.read.worker_rows`), one pipeline per worker over its share of the files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.exitcodes import EXIT_BAD_CONFIG
from mgpu_env.training.input.data.sets import (
    Arrays,
    Data,
    FileData,
    FileKind,
    FilePart,
    Layout,
    check_finite,
    release_pages,
)
from mgpu_env.training.shared.cache import user_cache_dir
from mgpu_env.training.shared.messages import npy_problem

LAYOUT_FILE = "dataset.json"
CACHE_FILE = ".mgpu-dataset.json"
CACHE_VERSION = 1
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp")
NPY_FILES = ("x_train", "y_train", "x_test", "y_test")
SPLITS = ("train", "test")


def read_layout(folder: Path) -> Layout:
    """`DIR/dataset.json`, checked; the defaults when there is none. Raises ConfigError."""
    path = folder / LAYOUT_FILE
    if not path.is_file():
        return Layout()
    valid = [f.name for f in fields(Layout)]
    try:
        given = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(given, dict):
            raise ValueError("not a JSON object")
        unknown = sorted(set(given) - set(valid))
        if unknown:
            raise ValueError(f"unknown keys {', '.join(unknown)}")
        for key in ("shape", "image_size"):
            if given.get(key) is not None:
                given[key] = tuple(int(d) for d in given[key])
        layout = Layout(**given)
        if layout.image_size is not None and len(layout.image_size) != 2:
            raise ValueError("image_size is [height, width]")
        if layout.dtype not in ("uint8", "float32") or layout.channels not in (0, 1, 3, 4):
            raise ValueError("dtype is uint8 or float32; channels 0, 1, 3 or 4")
    except (OSError, ValueError, TypeError) as err:
        raise ConfigError(
            f"{path} cannot be used ({err}).\n  Valid keys: {', '.join(valid)} (docs/data.md, "
            "\"Folders of files\"). Fix the file or remove it."
        ) from None
    return layout


def scan(kind: FileKind, folder: Path, layout: Layout) -> dict[str, FilePart]:
    """Each split's files (counts not yet known: 0), found by name. Raises ConfigError."""
    where = f"DATASET={kind}:{folder}"
    parts: dict[str, FilePart] = {}
    if kind == "tfrecord":
        names = sorted(p.name for p in folder.iterdir() if p.is_file())
        records = [n for n in names if ".tfrecord" in n or n.endswith(".tfrec")]
        for split in SPLITS:
            files = tuple(str(folder / n) for n in records if split in n)
            if files:
                parts[split] = FilePart(files, (0,) * len(files))
    elif kind == "images":
        classes = _class_folders(where, folder / "train")
        for split in SPLITS:
            if (folder / split).is_dir():
                parts[split] = _image_part(where, folder / split, classes)
    else:
        for split in SPLITS:
            if all((folder / f"{x}_{split}.npy").is_file() for x in ("x", "y")):
                parts[split] = FilePart(
                    tuple(str(folder / f"{x}_{split}.npy") for x in ("x", "y")), (0, 0)
                )
    missing = [split for split in SPLITS if split not in parts]
    if missing:
        expected = {
            "tfrecord": "files named like mnist-train.tfrecord-00000-of-00001 and "
                        "mnist-test.tfrecord-00000-of-00001",
            "images": "train/<class>/*.png and test/<class>/*.png",
            "npy": "x_train.npy, y_train.npy, x_test.npy, y_test.npy",
        }[kind]
        raise ConfigError(
            f"{where}: no {' and no '.join(missing)} split found.\n  Expected: {expected}."
        )
    return parts


def _class_folders(where: str, train: Path) -> list[str]:
    if not train.is_dir():
        return []
    classes = sorted(p.name for p in train.iterdir() if p.is_dir())
    if not classes:
        raise ConfigError(f"{where}: {train} holds no class folders.\n  Expected: "
                          "train/<class>/*.png, one folder per class.")
    return classes


def _image_part(where: str, split: Path, classes: list[str]) -> FilePart:
    files: list[str] = []
    labels: list[int] = []
    for folder in sorted(p for p in split.iterdir() if p.is_dir()):
        if folder.name not in classes:
            raise ConfigError(
                f"{where}: {folder} is a class the training folder does not have (its "
                f"classes: {', '.join(classes)}).\n  Fix: add train/{folder.name}, or "
                "remove it."
            )
        images = sorted(
            str(p) for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES
        )
        if not images:
            raise ConfigError(
                f"{where}: the class folder {folder} holds no images "
                f"({', '.join(IMAGE_SUFFIXES)}).\n  Fix: add its images, or remove it."
            )
        files += images
        labels += [classes.index(folder.name)] * len(images)
    if not files:
        raise ConfigError(f"{where}: {split} holds no class folders with images.")
    return FilePart(tuple(files), (1,) * len(files), tuple(labels))


def fingerprint(parts: dict[str, FilePart], layout: Layout) -> str:
    """What the counts depend on: every file's name, size and modification time, and the
    layout. Stat only: nothing is read."""
    entries: list[Any] = [CACHE_VERSION, asdict(layout)]
    for split in SPLITS:
        for name in parts[split].files:
            stat = os.stat(name)
            entries.append([split, name, stat.st_size, stat.st_mtime_ns])
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def cache_path(folder: Path, environ: dict[str, str] | None = None) -> Path:
    """DIR/.mgpu-dataset.json when DIR is writable, else one file per folder in the user's
    cache ($XDG_CACHE_HOME or ~/.cache, then mgpu/datasets)."""
    if os.access(folder, os.W_OK):
        return folder / CACHE_FILE
    key = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    return user_cache_dir("datasets", os.environ if environ is None else environ) / f"{key}.json"


def read_cache(path: Path, key: str) -> dict[str, Any] | None:
    """The counts stored for this fingerprint, or None (absent, stale or unreadable)."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stored if isinstance(stored, dict) and stored.get("fingerprint") == key else None


def write_cache(path: Path, counts: dict[str, Any]) -> None:
    """Store the counts (atomically: a reader sees the old file or the new one). A folder
    that cannot be written only costs the next run a recount."""
    from mgpu_env.training.shared.atomic import atomic_write_json

    with contextlib.suppress(OSError):
        atomic_write_json(path, counts)


def load_files(name: str, kind: FileKind, folder: Path, *, in_process: bool = True,
               prepare: Callable[[], None] | None = None) -> Data:
    """The folder's data set, counted and checked once (then cached). TFRecords and images
    are counted with TensorFlow: here, after `prepare()` (the runtime's device split), or,
    with `in_process=False`, in a child process, so that this one has not started
    TensorFlow's runtime (MultiWorkerMirroredStrategy must be made first). ConfigError."""
    folder = folder.resolve()
    layout = read_layout(folder)
    parts = scan(kind, folder, layout)
    key = fingerprint(parts, layout)
    where = cache_path(folder)
    counts = read_cache(where, key)
    if counts is None:
        if kind != "npy" and not in_process:
            _count_in_child(name)
            counts = read_cache(where, key)
        if counts is None:
            if kind != "npy" and prepare is not None:
                prepare()
            counts = {"fingerprint": key, **count(name, kind, parts, layout)}
            write_cache(where, counts)
    if kind == "npy":
        return _npy_arrays(name, parts, int(counts["num_classes"]))
    train, test = (
        FilePart(parts[s].files, tuple(counts[f"{s}_counts"]), parts[s].labels) for s in SPLITS
    )
    return FileData(name, kind, folder, layout, train, test,
                    tuple(counts["sample_shape"]), int(counts["num_classes"]))


def _count_in_child(name: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mgpu_env.training.input.data.count", name],
        capture_output=True, text=True, check=False,
    )
    if result.returncode == EXIT_BAD_CONFIG:
        raise ConfigError(result.stderr.strip().removeprefix("error: "))
    if result.returncode != 0:
        raise ConfigError(f"DATASET={name}: counting its records failed:\n{result.stderr}")


def count(name: str, kind: FileKind, parts: dict[str, FilePart], layout: Layout
          ) -> dict[str, Any]:
    """Read every record once: sizes, sample shape and classes, checked. ConfigError."""
    where = f"DATASET={name}"
    if kind == "npy":
        return _count_npy(where, parts, layout)
    from mgpu_env.training.input.data.read import count_part

    found = {split: count_part(where, kind, parts[split], layout) for split in SPLITS}
    shapes = {split: tuple(found[split]["sample_shape"]) for split in SPLITS}
    if shapes["train"] != shapes["test"]:
        raise ConfigError(
            f"{where}: training samples have shape {shapes['train']}, test samples "
            f"{shapes['test']}.\n  Fix: set image_size (and channels) in "
            f"{LAYOUT_FILE}, so every image is made one shape."
        )
    if kind == "images":
        classes = max(parts["train"].labels or (0,)) + 1
    else:
        classes = _classes(where, layout, *(
            (found[s]["min_label"], found[s]["max_label"], s) for s in SPLITS
        ))
    return {
        "train_counts": found["train"]["counts"], "test_counts": found["test"]["counts"],
        "sample_shape": list(shapes["train"]), "num_classes": classes,
    }


def _classes(where: str, layout: Layout, *ranges: tuple[int, int, str]) -> int:
    """The classes: dataset.json's `classes`, else the largest training label + 1; every
    label must be among them."""
    train_high = next(r[1] for r in ranges if r[2] == "train")
    classes = layout.classes if layout.classes is not None else max(2, train_high + 1)
    for lo, hi, split in ranges:
        if lo < 0 or hi >= classes:
            source = (f"classes={classes} in {LAYOUT_FILE}" if layout.classes is not None
                      else f"the training labels 0..{train_high}")
            raise ConfigError(
                f"{where}: the {split} labels run {lo}..{hi}, outside 0..{classes - 1} "
                f"({source}).\n  Fix: labels are class numbers 0..classes-1; correct them, "
                f"or set classes in {LAYOUT_FILE}."
            )
    return classes


def _open_npy(where: str, path: str) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{where}: {path} cannot be read: {npy_problem(Path(path), err)}.\n"
            "  Fix: copy it again whole, or write it again with np.save (an array of numbers)."
        ) from None


def _npy_part(where: str, part: FilePart, split: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = (_open_npy(where, path) for path in part.files)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if x.ndim < 2 or x.shape[0] == 0 or y.shape != (x.shape[0],):
        raise ConfigError(
            f"{where}: x_{split}.npy has shape {x.shape} and y_{split}.npy {y.shape}; "
            f"expected (N, *sample_shape) with N > 0, and (N,) labels."
        )
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        raise ConfigError(f"{where}: x_{split}.npy holds {x.dtype}, not numbers.")
    if not np.issubdtype(y.dtype, np.integer):
        raise ConfigError(
            f"{where}: y_{split}.npy holds {y.dtype}; expected integer class labels."
        )
    return x, y


def _count_npy(where: str, parts: dict[str, FilePart], layout: Layout) -> dict[str, Any]:
    train, test = (_npy_part(where, parts[s], s) for s in SPLITS)
    if train[0].shape[1:] != test[0].shape[1:]:
        raise ConfigError(
            f"{where}: x_train samples have shape {train[0].shape[1:]}, x_test samples "
            f"{test[0].shape[1:]}.\n  Fix: give both the same sample shape."
        )
    classes = _classes(where, layout, *(
        (int(y.min()), int(y.max()), split)
        for (_, y), split in zip((train, test), SPLITS, strict=True)
    ))
    for (x, _), split in zip((train, test), SPLITS, strict=True):
        check_finite(where, x, split)
    return {
        "train_counts": [train[0].shape[0]], "test_counts": [test[0].shape[0]],
        "sample_shape": list(train[0].shape[1:]), "num_classes": classes,
    }


def _npy_arrays(name: str, parts: dict[str, FilePart], classes: int) -> Arrays:
    """The four files memory-mapped (the samples are never read whole here); the labels,
    small, as int32."""
    where = f"DATASET={name}"
    (x_train, y_train), (x_test, y_test) = (_npy_part(where, parts[s], s) for s in SPLITS)
    labels = [np.asarray(y, dtype=np.int32) for y in (y_train, y_test)]
    for y in (y_train, y_test):
        release_pages(y)  # read whole once: the map's pages need not stay in the RSS
    return Arrays(name, x_train, labels[0], x_test, labels[1], classes)
