"""Small folders of files in each layout `DATASET=tfrecord:/images:/npy:` reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.support.runtimes import split_tensorflow


def image_bytes(image: np.ndarray, fmt: str = "png") -> bytes:
    tf = split_tensorflow()

    encode = tf.io.encode_png if fmt == "png" else tf.io.encode_jpeg
    return bytes(encode(image).numpy())


def example(image: bytes, label: int) -> bytes:
    tf = split_tensorflow()

    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_tfrecords(folder: Path, files: int = 4, per_file: int = 32, test_files: int = 1,
                    side: int = 8, classes: int = 4, label_is_index: bool = False) -> Path:
    """TFDS-style `data-train.tfrecord-0000i-of-0000n` files of PNGs whose first pixel and
    label say which record they are (record i of the split has pixel i % 256)."""
    tf = split_tensorflow()

    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", files), ("test", test_files)):
        for f in range(count):
            name = folder / f"data-{split}.tfrecord-{f:05d}-of-{count:05d}"
            with tf.io.TFRecordWriter(str(name)) as out:
                for r in range(per_file):
                    index = f * per_file + r
                    image = np.full((side, side, 1), index % 256, np.uint8)
                    label = index if label_is_index else index % classes
                    out.write(example(image_bytes(image), label))
    return folder


def write_images(folder: Path, classes: tuple[str, ...] = ("cat", "dog"), per_class: int = 6,
                 side: int = 8, test_per_class: int = 2) -> Path:
    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("test", test_per_class)):
        for name in classes:
            (folder / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                image = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
                (folder / split / name / f"{i}.png").write_bytes(image_bytes(image))
    return folder


def write_npy(folder: Path, train: int = 64, test: int = 16, shape: tuple[int, ...] = (8, 8),
              dtype: str = "uint8", classes: int = 4) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("test", test)):
        x = rng.integers(0, 256, (n, *shape)).astype(dtype)
        np.save(folder / f"x_{split}.npy", x)
        np.save(folder / f"y_{split}.npy", (np.arange(n) % classes).astype(np.int64))
    return folder


def write_layout(folder: Path, **layout: object) -> None:
    (folder / "dataset.json").write_text(json.dumps(layout))


def replace_keeping_stat(path: Path, data: bytes) -> None:
    """Write `data` (of the file's size) over the file and put its modification time back,
    as bit rot leaves a file: the counts' cache, keyed by name, size and mtime, still holds."""
    import os

    stat = path.stat()
    assert len(data) == stat.st_size
    path.write_bytes(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def flip_record_byte(path: Path, record: int) -> bytes:
    """Flip a byte in the middle of a TFRecord record's payload, so its CRC fails; the file
    keeps its size and mtime. Returns the file's bytes as they were."""
    original = path.read_bytes()
    data = bytearray(original)
    offset = 0
    for _ in range(record):  # each record: length (8), its CRC (4), payload, payload CRC (4)
        offset += 16 + int.from_bytes(data[offset : offset + 8], "little")
    length = int.from_bytes(data[offset : offset + 8], "little")
    data[offset + 12 + length // 2] ^= 0xFF
    replace_keeping_stat(path, bytes(data))
    return original
