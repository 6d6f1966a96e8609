"""Which data set a run uses, and loading it.

Resolving (`resolve_dataset`) reads the filesystem only, no TensorFlow, no network, so
`DATASET=auto` cannot hang offline; `load_data` loads the data set resolved."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.parsers import file_dataset
from mgpu_env.training.input.data.builtin import (
    FASHION_DIR,
    MNIST_FILE,
    SYSTEM_FASHION_DIR,
    fashion_folder_complete,
    keras_cache_dir,
    read_built_in,
)
from mgpu_env.training.input.data.files import load_files
from mgpu_env.training.input.data.sets import Arrays, Data, DatasetChoice, FileData, Streamed

if TYPE_CHECKING:
    from mgpu_env.training.input.keep import KeepLimit


def resolve_dataset(
    name: str,
    data_dir: Path | None,
    environ: Mapping[str, str] | None = None,
    system_fashion_dir: Path = SYSTEM_FASHION_DIR,
) -> DatasetChoice:
    """Decide which data set to use and from where. Filesystem only: no TF, no network
    (a loader, `package.module:function`, is only named here, and a folder of files,
    `kind:DIR`, only found; `load_data` calls the one and counts the other)."""
    files = file_dataset(name)
    if files is not None:
        return DatasetChoice(name, "files", files[1])
    if ":" in name:
        return DatasetChoice(name, "hook")
    cache = keras_cache_dir(environ)
    if name in ("mnist", "auto"):
        for folder in (data_dir, cache):
            if folder is not None and (folder / MNIST_FILE).is_file():
                return DatasetChoice("mnist", "file", folder / MNIST_FILE)
        if name == "auto":
            where = (
                f"in neither {data_dir} (DATA_DIR) nor {cache}" if data_dir else f"not in {cache}"
            )
            return DatasetChoice(
                "digits",
                "built-in",
                note=(
                    f"DATASET=auto: {MNIST_FILE} is {where}, so training uses "
                    "the built-in digits (set DATASET=mnist to download MNIST)"
                ),
            )
        return DatasetChoice("mnist", "download", cache / MNIST_FILE)
    if name == "fashion_mnist":
        candidates = [
            folder
            for folder in (
                data_dir / FASHION_DIR if data_dir else None,
                data_dir,
                cache / FASHION_DIR,
                system_fashion_dir,
            )
            if folder is not None
        ]
        for folder in candidates:
            if fashion_folder_complete(folder):
                return DatasetChoice("fashion_mnist", "file", folder)
        return DatasetChoice("fashion_mnist", "download", cache / FASHION_DIR)
    if name == "digits":
        return DatasetChoice("digits", "built-in")
    if name == "synthetic":
        return DatasetChoice("synthetic", "generated")
    raise ConfigError(
        f"Unknown data set {name!r}. Valid: auto, mnist, digits, synthetic, fashion_mnist."
    )




def load_data(choice: DatasetChoice, seed: int, *, in_process: bool = True,
              prepare: Callable[[], None] | None = None) -> Data:
    """The chosen data set: arrays, a loader's data too big to read (streams), or files.
    TFRecords and images not counted yet are counted after `prepare()`, or in a child
    process with `in_process=False` (`files.load_files`)."""
    if choice.origin == "files":
        found = file_dataset(choice.name)
        assert found is not None  # resolve_dataset made it from this name
        kind, folder = found
        return load_files(choice.name, kind, folder,  # type: ignore[arg-type]
                          in_process=in_process, prepare=prepare)
    if choice.origin == "hook":
        import mgpu_env.training.input.data.loader as loader

        train, test = loader.load_data(choice.name)
        classes = loader.num_classes(train, test)
        if isinstance(train, loader.RowStream):
            return Streamed(choice.name, train, test, classes)
        if isinstance(test, loader.RowStream):  # small training rows, a test set too big
            return Streamed(choice.name, loader.as_stream(train), test, classes)
        return Arrays(choice.name, *train, *test, classes)
    return read_built_in(choice, seed)


def load_arrays(choice: DatasetChoice, seed: int, keep: KeepLimit | None = None) -> Arrays:
    """The chosen data set, which must be arrays (a loader's stream is refused). Files are
    read whole where the run's feed plan keeps them under `keep`: the caller's keep limit
    (`mgpu bench`: training's, `plan_keep`), else the fixed one."""
    data = load_data(choice, seed)
    if isinstance(data, FileData):
        from mgpu_env.training.input.data.read import read_whole
        from mgpu_env.training.input.feeds.registry import plan_feed
        from mgpu_env.training.input.keep import FALLBACK, GIB

        keep = FALLBACK if keep is None else keep
        # The run's decision, under that limit: files kept on a device are read whole.
        if plan_feed(data, keep, global_batch=1).kind == "resident":
            return read_whole(data)
        raise ConfigError(
            f"DATASET={choice.name}: its decoded samples are over {keep.bytes / GIB:.3g} GiB, "
            "so they stream from "
            "the files; only mgpu train takes that stream.\n"
            "  Fix: use mgpu train, or a smaller folder (or image_size) here."
        )
    if not isinstance(data, Arrays):
        raise ConfigError(
            f"DATASET={choice.name} gives a tf.data set over 2 GiB, which streams; only "
            "mgpu train and mgpu bench take a stream.\n"
            "  Fix: use one of them, or have the loader return a smaller data set."
        )
    return data
