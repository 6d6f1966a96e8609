"""The built-in data sets: MNIST, Fashion-MNIST, scikit-learn's digits, synthetic rows.

`auto` takes MNIST when `mnist.npz` is already in `DATA_DIR` or in Keras' cache, else the
built-in digits (`data.resolve`); only an explicit `DATASET=mnist` (or `fashion_mnist`)
downloads, with a short network timeout. Every one is returned the same way: flattened
784-value rows of float32 in [0, 1] and int32 labels 0..9, so the tutorial's 784-input model
works on each of them.
"""

from __future__ import annotations

import gzip
import os
import socket
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.input.data.sets import CLASSES, FEATURES, IMAGE_SIDE, Arrays, DatasetChoice

MNIST_FILE = "mnist.npz"
MNIST_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
MNIST_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"
FASHION_DIR = "fashion-mnist"  # Keras' cache subfolder and the Debian package's folder
FASHION_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"
FASHION_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
# Debian's `dataset-fashion-mnist` installs the four gzipped IDX files here.
SYSTEM_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
DOWNLOAD_TIMEOUT_S = 30.0
SYNTHETIC_TRAIN = 60_000
SYNTHETIC_TEST = 10_000
DIGITS_TEST_FRACTION = 0.2


def keras_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Keras' download cache: $KERAS_HOME/datasets, else ~/.keras/datasets (as Keras does)."""
    environ = os.environ if environ is None else environ
    home = environ.get("KERAS_HOME")
    base = Path(home) if home else Path(environ.get("HOME", str(Path.home()))) / ".keras"
    return base.expanduser() / "datasets"


def fashion_folder_complete(folder: Path) -> bool:
    return all(_idx_file(folder, stem) is not None for stem in FASHION_FILES.values())


def _idx_file(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / f"{stem}.gz", folder / stem):
        if candidate.is_file():
            return candidate
    return None


def read_built_in(choice: DatasetChoice, seed: int) -> Arrays:
    """Read (or download, or generate) a built-in data set. Raises ConfigError, never exits."""
    if choice.name == "mnist":
        path = choice.location
        assert path is not None
        if choice.origin == "download":
            path = _download(
                MNIST_FILE, MNIST_URL, path.parent, MNIST_SHA256,
                where_to_put=f"put {MNIST_FILE} in DATA_DIR or in {path.parent}",
            )
        return _load_mnist_npz(path)
    if choice.name == "fashion_mnist":
        folder = choice.location
        assert folder is not None
        if choice.origin == "download":
            for stem in FASHION_FILES.values():
                _download(
                    f"{stem}.gz", FASHION_URL + f"{stem}.gz", folder, None,
                    where_to_put=(
                        f"install Debian's dataset-fashion-mnist (files in {SYSTEM_FASHION_DIR}), "
                        f"or put the four IDX files in DATA_DIR or in {folder}"
                    ),
                )
        return _load_fashion(folder)
    if choice.name == "digits":
        return _load_digits(seed)
    if choice.name == "synthetic":
        return synthetic_arrays(seed)
    raise ConfigError(f"Unknown data set {choice.name!r}.")


def _download(
    fname: str, url: str, folder: Path, sha256: str | None, where_to_put: str
) -> Path:
    """Download into Keras' cache with a timeout; offline is a ConfigError that says what to do."""
    import keras

    previous = socket.getdefaulttimeout()
    # urllib has no timeout by default: a firewall that drops packets would hang forever.
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        return Path(
            keras.utils.get_file(
                fname,
                origin=url,
                file_hash=sha256,
                cache_dir=str(folder),
                cache_subdir=".",
            )
        )
    except Exception as err:
        raise ConfigError(
            f"Could not download {fname} from {url}: {err}.\n"
            f"  Offline? {where_to_put}; or use DATASET=digits (built in)."
        ) from None
    finally:
        socket.setdefaulttimeout(previous)


def _check_images_labels(
    source: str, images: np.ndarray, labels: np.ndarray, part: str
) -> None:
    if images.ndim != 3 or images.shape[1:] != (IMAGE_SIDE, IMAGE_SIDE):
        raise ConfigError(
            f"{source}: {part} images have shape {images.shape}, expected (N, 28, 28)."
        )
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ConfigError(
            f"{source}: {part} has {images.shape[0]} images but labels of shape {labels.shape}."
        )
    if images.shape[0] == 0:
        raise ConfigError(f"{source}: {part} holds no images.")
    if labels.size and (labels.min() < 0 or labels.max() >= CLASSES):
        raise ConfigError(
            f"{source}: {part} labels run {labels.min()}..{labels.max()}, expected 0..9."
        )


def _to_rows(images: np.ndarray) -> np.ndarray:
    scale = 255.0 if images.dtype == np.uint8 or images.max(initial=0) > 1.0 else 1.0
    return (images.reshape(images.shape[0], FEATURES).astype(np.float32) / scale).astype(
        np.float32
    )


def _load_mnist_npz(path: Path) -> Arrays:
    fix = (
        f"Fix: delete {path} (an explicit DATASET=mnist downloads it again) or replace it "
        f"with {MNIST_URL}."
    )
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in npz]
            if missing:
                raise ConfigError(
                    f"{path} is not an MNIST file: it lacks {', '.join(missing)}.\n  {fix}"
                )
            parts = {k: np.asarray(npz[k]) for k in ("x_train", "y_train", "x_test", "y_test")}
    except ConfigError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise ConfigError(f"{path} cannot be read as MNIST ({err}).\n  {fix}") from None
    try:
        _check_images_labels(str(path), parts["x_train"], parts["y_train"], "x_train/y_train")
        _check_images_labels(str(path), parts["x_test"], parts["y_test"], "x_test/y_test")
    except ConfigError as err:
        raise ConfigError(f"{err}\n  {fix}") from None
    return _arrays("mnist", parts)


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzipped or not. Raises ConfigError."""
    opener: Any = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError, zlib.error) as err:
        raise ConfigError(f"{path} cannot be read ({err}).") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ConfigError(f"{path} is not an IDX file of unsigned bytes.")
    dims = data[3]
    header = 4 + 4 * dims
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    if len(data) != header + int(np.prod(shape)):
        raise ConfigError(
            f"{path}: the header says shape {shape} but the file is truncated or too long."
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def _load_fashion(folder: Path) -> Arrays:
    parts: dict[str, np.ndarray] = {}
    for key, stem in FASHION_FILES.items():
        path = _idx_file(folder, stem)
        if path is None:
            raise ConfigError(f"{folder} lacks {stem}(.gz) of Fashion-MNIST.")
        parts[key] = read_idx(path)
    source = f"Fashion-MNIST in {folder}"
    _check_images_labels(source, parts["x_train"], parts["y_train"], "train")
    _check_images_labels(source, parts["x_test"], parts["y_test"], "test")
    return _arrays("fashion_mnist", parts)


def _arrays(name: str, parts: dict[str, np.ndarray]) -> Arrays:
    """Checked MNIST-layout images and labels as the model's 784-value rows and int32 labels."""
    return Arrays(
        name,
        _to_rows(parts["x_train"]),
        parts["y_train"].astype(np.int32),
        _to_rows(parts["x_test"]),
        parts["y_test"].astype(np.int32),
    )


def digits_to_mnist_layout(images_8x8: np.ndarray) -> np.ndarray:
    """8x8 digits (values 0..16) as 28x28 images in [0, 1], laid out like MNIST.

    Each pixel becomes a 3x3 block (nearest-neighbour upscaling, 8x8 -> 24x24), and a
    2-pixel border of zeros is added on every side (24x24 -> 28x28): MNIST's digits are
    likewise centred with an empty margin. The result feeds the same 784-input model.
    """
    scaled = np.kron(images_8x8.reshape(-1, 8, 8), np.ones((3, 3))) / 16.0
    padded = np.pad(scaled, ((0, 0), (2, 2), (2, 2)))
    return padded.astype(np.float32)


def _load_digits(seed: int) -> Arrays:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits_to_mnist_layout(digits.images).reshape(-1, FEATURES)
    labels = digits.target.astype(np.int32)
    # Stratified and seeded: the same SEED always gives the same split, every class in both.
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=DIGITS_TEST_FRACTION, random_state=seed, stratify=labels
    )
    return Arrays("digits", x_train, y_train, x_test, y_test)


def synthetic_arrays(
    seed: int, train: int = SYNTHETIC_TRAIN, test: int = SYNTHETIC_TEST
) -> Arrays:
    """Random MNIST-shaped data (60000 + 10000 rows of 784 values), for benchmarks."""
    rng = np.random.default_rng(seed)
    return Arrays(
        "synthetic",
        rng.random((train, FEATURES), dtype=np.float32),
        rng.integers(0, CLASSES, train, dtype=np.int32),
        rng.random((test, FEATURES), dtype=np.float32),
        rng.integers(0, CLASSES, test, dtype=np.int32),
    )
