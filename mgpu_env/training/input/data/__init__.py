"""The data sets `mgpu train` knows, where each comes from, and how they are read.

- `sets`: the types: `DatasetChoice`, and the loaded `Arrays`, `Streamed`, `FileData`.
- `resolve`: which data set a run uses (filesystem only) and loading it.
- `builtin`: MNIST, Fashion-MNIST, scikit-learn's digits, synthetic rows.
- `files`: folders of files (`tfrecord:DIR`, `images:DIR`, `npy:DIR`): found, counted once,
  checked, cached; `read`: their tf.data pipelines.
- `pipeline`: the test set for evaluation.

`DATASET=package.module:function` is the user's loader (`loader.py` has its
contract): any sample shape, any number of classes.
"""

from mgpu_env.training.input.data.builtin import (
    DOWNLOAD_TIMEOUT_S,
    MNIST_URL,
    digits_to_mnist_layout,
    keras_cache_dir,
    read_idx,
    synthetic_arrays,
)
from mgpu_env.training.input.data.pipeline import test_dataset
from mgpu_env.training.input.data.resolve import load_arrays, load_data, resolve_dataset
from mgpu_env.training.input.data.sets import (
    CLASSES,
    FEATURES,
    IMAGE_SIDE,
    Arrays,
    Data,
    DatasetChoice,
    DataSizes,
    FileData,
    Streamed,
    as_float32,
    check_finite,
    float32_rows,
    release_pages,
    take_rows,
)

__all__ = [
    "CLASSES", "DOWNLOAD_TIMEOUT_S", "FEATURES", "IMAGE_SIDE", "MNIST_URL", "Arrays", "Data",
    "DataSizes", "DatasetChoice", "FileData", "Streamed", "as_float32", "check_finite",
    "digits_to_mnist_layout", "float32_rows", "keras_cache_dir", "load_arrays", "load_data",
    "read_idx",
    "release_pages", "resolve_dataset", "synthetic_arrays", "take_rows", "test_dataset",
]
