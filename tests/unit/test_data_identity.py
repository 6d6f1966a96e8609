"""The data's identity run.json records (`training.run.dataid`): a resume on other rows,
fewer, more or the same number changed, is refused naming both values (no TensorFlow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.input.data.sets import Arrays
from mgpu_env.training.run.dataid import check_same_data, data_identity


def arrays(train: int, seed: int = 0, x_train: np.ndarray | None = None) -> Arrays:
    rng = np.random.default_rng(seed)
    drawn = rng.random((train, 784), dtype=np.float32)
    x = drawn if x_train is None else x_train
    return Arrays("npy", x, rng.integers(0, 10, train).astype(np.int32),
                  rng.random((50, 784), dtype=np.float32),
                  rng.integers(0, 10, 50).astype(np.int32))


def test_the_same_rows_are_the_same_data_read_from_memory_or_a_mapped_file(
    tmp_path: Path,
) -> None:
    data = arrays(600)
    np.save(tmp_path / "x.npy", data.x_train)
    mapped = arrays(600, x_train=np.load(tmp_path / "x.npy", mmap_mode="r"))
    assert data_identity(data) == data_identity(mapped)
    record = data_identity(data)
    assert record["train_rows"] == 600 and record["test_rows"] == 50
    assert record["sample_shape"] == [784] and record["dtype"] == "float32"
    check_same_data(record, data_identity(mapped), tmp_path, "npy:x")
    check_same_data(None, record, tmp_path, "npy:x")  # an older run: nothing to compare


@pytest.mark.parametrize(("change", "names"), [
    ("fewer", ["train_rows 600 then, 300 now", "fingerprint"]),
    ("more", ["train_rows 600 then, 900 now", "fingerprint"]),
    ("one value of one sampled row", ["fingerprint 'rows:"]),
])
def test_changed_data_is_refused_naming_both_values(
    tmp_path: Path, change: str, names: list[str],
) -> None:
    data = arrays(600)
    if change == "fewer":
        other = arrays(300)
    elif change == "more":
        other = arrays(900)
    else:
        x = data.x_train.copy()
        x[599, 3] += 1.0  # the last row is always sampled
        other = Arrays(data.name, x, data.y_train, data.x_test, data.y_test)
    with pytest.raises(ConfigError) as caught:
        check_same_data(data_identity(data), data_identity(other), tmp_path, "npy:/data")
    message = str(caught.value)
    assert caught.value.exit_code == 2 and "DATASET=npy:/data gives" in message
    assert all(name in message for name in names), message
    assert "another RUN_NAME or OUTPUT_DIR" in message
