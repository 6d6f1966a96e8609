"""A stand-in for `tensorflow_datasets`, for the corpus's scripts, offline: only what they
call, `tfds.load('mnist', ...)` and `tfds.disable_progress_bar()`.

`load` serves the MNIST stand-in that tests/processes/test_keras2_scripts.py writes where Keras
caches MNIST (~/.keras/datasets/mnist.npz), shaped as TFDS gives MNIST with
`as_supervised=True`: (uint8 image of shape (28, 28, 1), int64 label). Any other data set is
refused, so a script that needs one fails plainly instead of training on the wrong data.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any


def disable_progress_bar() -> None:
    """TFDS's progress bar switch: nothing to switch here."""


def load(name: str, *, with_info: bool = False, as_supervised: bool = False,
         split: Any = None, data_dir: Any = None, **_: Any) -> Any:
    import numpy as np
    import tensorflow as tf

    if name != "mnist" or not as_supervised or split is not None:
        raise NotImplementedError(
            f"the offline tensorflow_datasets stand-in serves tfds.load('mnist', "
            f"as_supervised=True) only, not {name!r} (split={split!r})")
    path = os.path.join(os.path.expanduser("~"), ".keras", "datasets", "mnist.npz")
    with np.load(path) as data:
        arrays = {"train": (data["x_train"], data["y_train"]),
                  "test": (data["x_test"], data["y_test"])}
    datasets = {
        split_name: tf.data.Dataset.from_tensor_slices(
            (images[..., None], labels.astype(np.int64)))
        for split_name, (images, labels) in arrays.items()
    }
    if not with_info:
        return datasets
    splits = {split_name: SimpleNamespace(num_examples=len(labels))
              for split_name, (_, labels) in arrays.items()}
    info = SimpleNamespace(splits=splits, features={"label": SimpleNamespace(num_classes=10)})
    return datasets, info
