"""Data set resolution and loading: where each data set comes from, offline, bad files."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.input.data import (
    DatasetChoice,
    builtin,
    digits_to_mnist_layout,
    load_arrays,
    read_idx,
    resolve_dataset,
)


def write_npz(path: Path, train: int = 12, test: int = 4, side: int = 28) -> Path:
    rng = np.random.default_rng(0)
    np.savez(
        path,
        x_train=rng.integers(0, 256, (train, side, side), dtype=np.uint8),
        y_train=rng.integers(0, 10, train, dtype=np.uint8),
        x_test=rng.integers(0, 256, (test, side, side), dtype=np.uint8),
        y_test=rng.integers(0, 10, test, dtype=np.uint8),
    )
    return path


def write_idx(path: Path, array: np.ndarray) -> Path:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(
        int(n).to_bytes(4, "big") for n in array.shape
    )
    payload = header + array.astype(np.uint8).tobytes()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)
    return path


def write_fashion(folder: Path, gz: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    ext = ".gz" if gz else ""
    write_idx(folder / f"train-images-idx3-ubyte{ext}", rng.integers(0, 256, (6, 28, 28)))
    write_idx(folder / f"train-labels-idx1-ubyte{ext}", rng.integers(0, 10, 6))
    write_idx(folder / f"t10k-images-idx3-ubyte{ext}", rng.integers(0, 256, (2, 28, 28)))
    write_idx(folder / f"t10k-labels-idx1-ubyte{ext}", rng.integers(0, 10, 2))
    return folder


@pytest.fixture
def empty_home(tmp_path: Path) -> dict[str, str]:
    """An environment whose Keras cache is empty."""
    return {"HOME": str(tmp_path / "home")}


def test_auto_without_mnist_takes_digits_and_says_why(empty_home: dict[str, str]) -> None:
    choice = resolve_dataset("auto", None, empty_home, system_fashion_dir=Path("/nonexistent"))
    assert (choice.name, choice.origin) == ("digits", "built-in")
    assert choice.note and "mnist.npz" in choice.note and ".keras/datasets" in choice.note


def test_auto_prefers_data_dir_then_keras_cache(tmp_path: Path) -> None:
    keras_home = tmp_path / "kh"
    (keras_home / "datasets").mkdir(parents=True)
    cached = write_npz(keras_home / "datasets" / "mnist.npz")
    environ = {"KERAS_HOME": str(keras_home)}
    assert resolve_dataset("auto", None, environ) == DatasetChoice("mnist", "file", cached)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    own = write_npz(data_dir / "mnist.npz")
    assert resolve_dataset("auto", data_dir, environ).location == own


def test_explicit_mnist_without_file_plans_a_download(empty_home: dict[str, str]) -> None:
    choice = resolve_dataset("mnist", None, empty_home)
    assert choice.origin == "download"
    assert choice.location == Path(empty_home["HOME"]) / ".keras" / "datasets" / "mnist.npz"


def test_fashion_from_data_dir_cache_or_debian_folder(tmp_path: Path) -> None:
    system = write_fashion(tmp_path / "usr-share")
    environ = {"HOME": str(tmp_path / "home")}
    assert resolve_dataset("fashion_mnist", None, environ, system).location == system
    cache = write_fashion(tmp_path / "home" / ".keras" / "datasets" / "fashion-mnist", gz=False)
    assert resolve_dataset("fashion_mnist", None, environ, system).location == cache
    own = write_fashion(tmp_path / "data")
    assert resolve_dataset("fashion_mnist", own, environ, system).location == own
    missing = resolve_dataset("fashion_mnist", None, {"HOME": str(tmp_path / "x")},
                              tmp_path / "none")
    assert missing.origin == "download"


def test_fashion_loads_gzipped_and_plain_idx(tmp_path: Path) -> None:
    for gz in (True, False):
        folder = write_fashion(tmp_path / f"f{gz}", gz=gz)
        arrays = load_arrays(DatasetChoice("fashion_mnist", "file", folder), seed=0)
        assert arrays.x_train.shape == (6, 784) and arrays.x_test.shape == (2, 784)
        assert arrays.x_train.dtype == np.float32 and arrays.x_train.min() >= 0
        assert arrays.x_train.max() <= 1.0


def test_truncated_idx_is_a_clear_error(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "a-idx3-ubyte", np.zeros((3, 28, 28)))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ConfigError, match="truncated"):
        read_idx(path)


def test_mnist_npz_loads_and_normalises(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "mnist.npz")
    arrays = load_arrays(DatasetChoice("mnist", "file", path), seed=0)
    assert arrays.x_train.shape == (12, 784) and arrays.y_train.dtype == np.int32
    assert float(arrays.x_train.max()) <= 1.0


def test_corrupt_mnist_npz_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "mnist.npz"
    path.write_bytes(b"this is not a zip file at all")
    with pytest.raises(ConfigError) as caught:
        load_arrays(DatasetChoice("mnist", "file", path), seed=0)
    assert str(path) in str(caught.value) and "Fix:" in str(caught.value)


def test_wrong_shaped_mnist_npz_is_a_config_error(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "mnist.npz", side=20)
    with pytest.raises(ConfigError, match=r"expected \(N, 28, 28\)"):
        load_arrays(DatasetChoice("mnist", "file", path), seed=0)
    np.savez(tmp_path / "other.npz", images=np.zeros(3))
    with pytest.raises(ConfigError, match="lacks x_train"):
        load_arrays(DatasetChoice("mnist", "file", tmp_path / "other.npz"), seed=0)


def test_digits_are_mnist_shaped_and_split_by_seed() -> None:
    first = load_arrays(DatasetChoice("digits", "built-in"), seed=3)
    again = load_arrays(DatasetChoice("digits", "built-in"), seed=3)
    other = load_arrays(DatasetChoice("digits", "built-in"), seed=4)
    assert first.x_train.shape == (1437, 784) and first.x_test.shape == (360, 784)
    assert np.array_equal(first.y_test, again.y_test)
    assert not np.array_equal(first.y_test, other.y_test)
    assert set(np.unique(first.y_test)) == set(range(10))


def test_digit_layout_upscales_3x_and_pads_2() -> None:
    image = np.zeros((1, 8, 8))
    image[0, 0, 0] = 16
    out = digits_to_mnist_layout(image)
    assert out.shape == (1, 28, 28)
    assert out[0, 2:5, 2:5].min() == 1.0 and out.sum() == 9.0


@pytest.mark.slow
def test_offline_download_is_a_config_error_saying_where_to_put_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Port 9 (discard) on localhost refuses connections: a real failed download, at once.
    monkeypatch.setattr(builtin, "MNIST_URL", "http://127.0.0.1:9/mnist.npz")
    choice = resolve_dataset("mnist", None, {"HOME": str(tmp_path)})
    with pytest.raises(ConfigError) as caught:
        load_arrays(choice, seed=0)
    message = str(caught.value)
    assert "put mnist.npz in DATA_DIR" in message and "DATASET=digits" in message
