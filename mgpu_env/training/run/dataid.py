"""The identity of a run's data, so a resume on a data set that changed since is seen.

It is what run.json records with the run.

A checkpoint's position is a step of an order drawn from (SEED, epoch) over the training
rows: the same position on other rows trains rows never trained, or ends an epoch early.
The identity is the rows' and classes' counts, one sample's shape and type, and a cheap
fingerprint: a SHA-256 of 64 rows taken evenly through each split with their labels
(arrays, a `.npy` folder read row by row without reading it whole), or of the files'
names, sizes and record counts (TFRecord and image folders). A loader's stream is read
only by training it: its counts and shape stand for it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.input.data.sets import Arrays, Data, FileData, Streamed, take_rows

SAMPLED_ROWS = 64


def data_identity(data: Data) -> dict[str, Any]:
    """What run.json records of the data (JSON-ready)."""
    identity: dict[str, Any] = {
        "train_rows": data.train_size, "test_rows": data.test_size,
        "sample_shape": list(data.sample_shape), "classes": data.num_classes,
    }
    if isinstance(data, Arrays):
        digest = hashlib.sha256()
        for x, y in ((data.x_train, data.y_train), (data.x_test, data.y_test)):
            _sample_rows(digest, x, y)
        identity["dtype"] = str(data.x_train.dtype)
        identity["fingerprint"] = f"rows:{digest.hexdigest()[:16]}"
    elif isinstance(data, FileData):
        digest = hashlib.sha256()
        for part in (data.train, data.test):
            for file, count in zip(part.files, part.counts, strict=True):
                size = os.stat(file).st_size if os.path.exists(file) else -1
                digest.update(f"{Path(file).name}\0{size}\0{count}\n".encode())
            digest.update(repr(part.labels).encode())
        identity["fingerprint"] = f"files:{digest.hexdigest()[:16]}"
    elif isinstance(data, Streamed):
        identity["fingerprint"] = "stream: counts and shape only"
    return identity


def _sample_rows(digest: Any, x: Any, y: Any) -> None:
    import numpy as np

    rows = int(x.shape[0])
    picked = np.unique(np.linspace(0, max(rows - 1, 0), min(rows, SAMPLED_ROWS)).astype(np.int64))
    digest.update(f"{tuple(x.shape)}{x.dtype}{tuple(y.shape)}{y.dtype}".encode())
    if rows:
        digest.update(np.ascontiguousarray(take_rows(x, picked)).tobytes())
        digest.update(np.ascontiguousarray(np.asarray(y)[picked]).tobytes())


def check_same_data(recorded: Mapping[str, Any] | None, now: Mapping[str, Any],
                    output_dir: Path, dataset: str) -> None:
    """Refuse (ConfigError, exit 2) a resume on data other than the run's: each difference
    named with both values. None recorded (a run of an mgpu before this record): nothing
    to compare, the record is written now."""
    if recorded is None:
        return
    differences = [f"{key} {recorded.get(key)!r} then, {now.get(key)!r} now"
                   for key in now if key in recorded and recorded.get(key) != now.get(key)]
    if not differences:
        return
    raise ConfigError(
        f"The data changed since the run in OUTPUT_DIR={output_dir} was stopped: "
        f"DATASET={dataset} gives {'; '.join(differences)}. Its checkpoint's position is a "
        "step of the old rows' order: resuming would train rows it never had, or skip some."
        "\n  Fix: restore the data the run started with, or train on this data as a new "
        "run: another RUN_NAME or OUTPUT_DIR."
    )
