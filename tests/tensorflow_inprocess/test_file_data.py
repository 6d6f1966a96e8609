"""Folders of files as data sets (`DATASET=tfrecord:DIR`, `images:DIR`, `npy:DIR`): found,
counted once and cached, bad data refused before training, sharded between workers."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.parsers import SettingError, parse_dataset
from mgpu_env.training.input.data import Arrays, FileData, check_finite, files
from mgpu_env.training.input.data.files import load_files
from mgpu_env.training.shared.position import Position
from tests.support.filedata import (
    flip_record_byte,
    image_bytes,
    replace_keeping_stat,
    write_images,
    write_layout,
    write_npy,
    write_tfrecords,
)

parse = parse_dataset("auto", "mnist", "digits")


def load(kind: str, folder: Path) -> FileData | Arrays:
    data = load_files(f"{kind}:{folder}", kind, folder)  # type: ignore[arg-type]
    assert isinstance(data, (FileData, Arrays))
    return data

# The counting pass runs TensorFlow in this process: the CPU is split first.
pytestmark = pytest.mark.usefixtures("logical_cpus")



def test_dataset_setting_takes_folders_names_and_hooks(tmp_path: Path) -> None:
    assert parse(f"tfrecord:{tmp_path}") == f"tfrecord:{tmp_path}"
    assert parse(f"NPY:{tmp_path}") == f"npy:{tmp_path}"
    assert parse("mydata:load") == "mydata:load" and parse("Digits") == "digits"
    with pytest.raises(SettingError, match="existing folder"):
        parse(f"images:{tmp_path / 'missing'}")


def test_each_layout_is_counted_once_then_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders = {
        "tfrecord": write_tfrecords(tmp_path / "tf", files=2, per_file=8),
        "images": write_images(tmp_path / "im"),
        "npy": write_npy(tmp_path / "np"),
    }
    expected = {"tfrecord": (16, 8, (8, 8, 1), 4), "images": (12, 4, (8, 8, 3), 2),
                "npy": (64, 16, (8, 8), 4)}
    for kind, folder in folders.items():
        data = load(kind, folder)
        found = (data.train_size, data.test_size, data.sample_shape, data.num_classes)
        assert found == expected[kind], kind
        assert (folder / files.CACHE_FILE).is_file()
    monkeypatch.setattr(files, "count", lambda *a: pytest.fail("counted again"))
    for kind, folder in folders.items():
        assert load(kind, folder).train_size == expected[kind][0]
    npy = load("npy", folders["npy"])
    assert isinstance(npy, Arrays) and isinstance(npy.x_train, np.memmap)


def test_files_are_read_whole_only_under_the_callers_keep_limit(tmp_path: Path) -> None:
    from mgpu_env.training.input.data import load_arrays, resolve_dataset
    from mgpu_env.training.input.keep import KeepLimit

    choice = resolve_dataset(f"tfrecord:{write_tfrecords(tmp_path / 'tf', files=2, per_file=8)}",
                             None)
    assert load_arrays(choice, seed=0).train_size == 16  # the fixed limit keeps them
    assert load_arrays(choice, 0, KeepLimit(1024**3, "test")).train_size == 16
    with pytest.raises(ConfigError, match=r"decoded samples are over 0 GiB, so they stream"):
        load_arrays(choice, 0, KeepLimit(0, "nothing kept"))


def test_a_changed_file_is_counted_again(tmp_path: Path) -> None:
    folder = write_npy(tmp_path / "np")
    assert load("npy", folder).train_size == 64
    write_npy(folder, train=32)
    os.utime(folder / "x_train.npy", ns=(1, 1))  # another mtime even on a coarse clock
    assert load("npy", folder).train_size == 32


def test_a_read_only_folder_caches_in_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_npy(tmp_path / "np")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # As a read-only folder looks (chmod does not stop root, who runs these in containers).
    monkeypatch.setattr(files.os, "access", lambda path, mode: False)
    load("npy", folder)
    assert not (folder / files.CACHE_FILE).exists()
    assert len(list((tmp_path / "cache" / "mgpu" / "datasets").glob("*.json"))) == 1


def test_missing_splits_are_refused(tmp_path: Path) -> None:
    tf_folder = write_tfrecords(tmp_path / "tf", files=1, per_file=2)
    for path in tf_folder.glob("*test*"):
        path.unlink()
    with pytest.raises(ConfigError, match="no test split"):
        load("tfrecord", tf_folder)
    np_folder = write_npy(tmp_path / "np")
    (np_folder / "y_train.npy").unlink()
    with pytest.raises(ConfigError, match=r"(?s)no train split.*x_train.npy"):
        load("npy", np_folder)


def test_an_empty_class_folder_is_refused(tmp_path: Path) -> None:
    folder = write_images(tmp_path / "im")
    (folder / "train" / "bird").mkdir()
    with pytest.raises(ConfigError, match="bird holds no images"):
        load("images", folder)


def test_labels_out_of_range_are_refused(tmp_path: Path) -> None:
    folder = write_tfrecords(tmp_path / "tf", files=1, per_file=8, classes=4)
    write_layout(folder, classes=3)
    with pytest.raises(ConfigError, match=r"train labels run 0..3, outside 0..2"):
        load("tfrecord", folder)
    np_folder = write_npy(tmp_path / "np")
    y = np.load(np_folder / "y_test.npy")
    y[3] = 9
    np.save(np_folder / "y_test.npy", y)
    with pytest.raises(ConfigError, match=r"test labels run 0..9, outside 0..3"):
        load("npy", np_folder)


def test_corrupt_records_and_images_are_refused_naming_the_file(tmp_path: Path) -> None:
    folder = write_tfrecords(tmp_path / "tf", files=2, per_file=4)
    broken = sorted(folder.glob("*train*"))[1]
    broken.write_bytes(broken.read_bytes()[:-7])
    with pytest.raises(ConfigError, match=f"{broken.name} cannot be read"):
        load("tfrecord", folder)
    images = write_images(tmp_path / "im")
    (images / "train" / "dog" / "3.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(ConfigError, match=r"1 image cannot be decoded .*dog/3.png"):
        load("images", images)


def test_mixed_image_sizes_need_image_size(tmp_path: Path) -> None:
    folder = write_images(tmp_path / "im", side=8)
    write_images(tmp_path / "im", classes=("dog",), side=10, per_class=1, test_per_class=0)
    sizes = r"(?s)sizes, from \(8, 8, 3\) to \(10, 10, 3\).*image_size"
    with pytest.raises(ConfigError, match=sizes):
        load("images", folder)
    write_layout(folder, image_size=[6, 6])
    assert load("images", folder).sample_shape == (6, 6, 3)


def test_nan_features_are_refused_with_their_count_and_first_row(tmp_path: Path) -> None:
    folder = write_npy(tmp_path / "np", dtype="float32")
    x = np.load(folder / "x_train.npy")
    x[5, 1, 1], x[9, 0, 0] = np.nan, np.inf
    np.save(folder / "x_train.npy", x)
    with pytest.raises(ConfigError, match=r"2 of the 64 train samples .* row 5"):
        load("npy", folder)
    rows = np.ones((200_000, 2), np.float32)
    rows[150_000, 1] = np.nan  # past the first chunk
    with pytest.raises(ConfigError, match=r"1 of the 200000 x samples .* row 150000"):
        check_finite("here", rows, "x")


class _Strategy(SimpleNamespace):
    num_replicas_in_sync = 4  # 2 workers x 2 replicas


@pytest.mark.parametrize("train_files", [4, 1], ids=["by-file", "by-record"])
def test_two_workers_read_every_training_record_once_per_epoch(
    tmp_path: Path, train_files: int
) -> None:
    import tensorflow as tf

    from mgpu_env.training.input import feeds
    from mgpu_env.training.input.keep import KeepLimit

    nothing_kept = KeepLimit(0, "test")  # stream, as large data does
    per_file = 128 // train_files
    folder = write_tfrecords(tmp_path / "tf", files=train_files, per_file=per_file,
                             label_is_index=True)
    data = load("tfrecord", folder)
    assert isinstance(data, FileData)
    feed_plan = feeds.plan_feed(data, nothing_kept, 32, workers=2)
    stream = feeds.make_feed(feeds.FeedMaking(_Strategy(), data, feed_plan, 32, 3))
    assert isinstance(stream, feeds.FileStreamFeed)
    assert feed_plan.steps_per_epoch == 4
    orders = []
    for epoch in (0, 1):
        seen: list[int] = []
        for worker in (0, 1):
            context = tf.distribute.InputContext(num_input_pipelines=2,
                                                 input_pipeline_id=worker)
            batches = list(stream.worker_dataset(context, Position(epoch)).as_numpy_iterator())
            assert len(batches) == 4 * 2 and all(len(y) == 8 for _, y in batches)
            seen += [int(label) for _, y in batches for label in y]
        assert sorted(seen) == list(range(128)), "each record exactly once"
        orders.append(seen)
    assert orders[0] != orders[1], "each epoch has its own order"
    again = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0)
    replayed = stream.worker_dataset(again, Position(1)).as_numpy_iterator()
    replay = [int(v) for _, y in replayed for v in y]
    assert replay == orders[1][:64], "an epoch's order depends on SEED and the epoch only"


def test_bad_records_names_each_damaged_file_and_its_first_bad_record(tmp_path: Path) -> None:
    from mgpu_env.training.input.data.verify import bad_records

    folder = write_tfrecords(tmp_path / "tf", files=3, per_file=16)
    data = load("tfrecord", folder)
    assert isinstance(data, FileData)
    assert bad_records(data) == [] and bad_records(data, "test") == []
    first, _, third = sorted(folder.glob("*train*"))
    flip_record_byte(first, record=5)
    flip_record_byte(third, record=0)
    found = bad_records(data)
    assert [(bad.path, bad.record) for bad in found] == [(str(first), 5), (str(third), 0)]
    assert found[0].describe() == (
        f"{first} record 5 cannot be read ({found[0].problem})"
    )
    assert found[0].problem.startswith("corrupted record at ")
    # A label no longer a class is found too (on the CPU, training stops on it).
    import dataclasses

    fewer = bad_records(dataclasses.replace(data, num_classes=3), "test")
    assert [(b.record, b.problem) for b in fewer] == [(3, "label 3 is not a class 0..2")]


def test_bad_records_names_images_that_no_longer_decode(tmp_path: Path) -> None:
    from mgpu_env.training.input.data.verify import bad_records

    folder = write_images(tmp_path / "im")
    jpeg = folder / "train" / "cat" / "2.png"  # decode_image reads the bytes, not the name
    jpeg.write_bytes(image_bytes(np.zeros((8, 8, 3), np.uint8), "jpeg"))
    data = load("images", folder)
    assert isinstance(data, FileData)
    replace_keeping_stat(jpeg, jpeg.read_bytes()[:30] + bytes(jpeg.stat().st_size - 30))
    garbage = folder / "test" / "dog" / "1.png"
    replace_keeping_stat(garbage, bytes(garbage.stat().st_size))
    train, test = bad_records(data), bad_records(data, "test")
    assert [(b.path, b.record) for b in train] == [(str(jpeg), None)]
    assert "JPEG" in train[0].problem and train[0].describe().startswith(
        f"{jpeg} cannot be decoded (")
    assert [b.path for b in test] == [str(garbage)]
    assert test[0].problem.startswith("Unknown image file format")


def test_a_read_error_stops_the_run_naming_the_file_only_when_a_file_explains_it(
    tmp_path: Path,
) -> None:
    import tensorflow as tf

    from mgpu_env.config.errors import RunFailed
    from mgpu_env.training.input.corrupt import bad_records_message, stop_on_bad_records
    from mgpu_env.training.input.data.verify import BadRecord, tensorflow_message

    folder = write_tfrecords(tmp_path / "tf", files=2, per_file=8)
    data = load("tfrecord", folder)
    assert isinstance(data, FileData)
    error = tf.errors.DataLossError(None, None, "corrupted record at 12 [[{{node x}}]]")
    assert tensorflow_message(error) == "corrupted record at 12"
    # No file explains it, or it is no read error (nothing re-read): it goes on up.
    with pytest.raises(tf.errors.DataLossError), stop_on_bad_records(data, ("train",), 1, "r"):
        raise error
    memory = tf.errors.ResourceExhaustedError(None, None, "out of memory")
    with pytest.raises(type(memory)), stop_on_bad_records(data, ("train",), 1, "r"):
        raise memory
    damaged = sorted(folder.glob("*train*"))[1]
    flip_record_byte(damaged, record=2)
    named = (rf"(?s){damaged.name} record 2 cannot be read \(corrupted record at \d+\), met "
             r"in epoch 4: .* epoch 3 is kept.*\.mgpu-dataset\.json.*resume with: resume")
    with pytest.raises(RunFailed, match=named), stop_on_bad_records(data, ("train",), 3, "resume"):
        raise error
    bad = [BadRecord(f"/d/{i}.png", None, "Invalid PNG") for i in range(6)]
    message = bad_records_message(data, bad, None, "resume")
    assert message.startswith("/d/0.png cannot be decoded (Invalid PNG), met in the evaluation")
    assert "Also bad: /d/1.png, /d/2.png, /d/3.png and 2 more" in message
    assert "no epoch had completed" in bad_records_message(data, bad[:1], 0, "resume")


def rss_file_mib() -> float:
    """This process's resident pages of mapped files (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) / 1024
    pytest.skip("no RssFile in /proc/self/status (not Linux)")


def test_rows_of_a_mapped_npy_are_read_without_mapping_its_pages(tmp_path: Path) -> None:
    from mgpu_env.training.input.data import release_pages, take_rows

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (65_536, 1024), np.uint8)  # 64 MiB
    np.save(tmp_path / "x.npy", x)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    rows = rng.integers(0, len(x), (40, 256))  # a chunk's shape: (steps, batch)
    before = rss_file_mib()
    taken = take_rows(mapped, rows)
    assert rss_file_mib() - before < 8, "the file's pages stayed in this process's memory"
    assert taken.shape == (40, 256, 1024) and np.array_equal(taken, x[rows])
    # Big-endian floats, and what pread cannot serve (a view, Fortran order, plain arrays).
    floats = rng.random((500, 3, 2)).astype(">f4")
    np.save(tmp_path / "f.npy", floats)
    np.save(tmp_path / "fortran.npy", np.asfortranarray(floats))
    some = np.array([399, 0, 7, 7])
    for array, expected in (
        (np.load(tmp_path / "f.npy", mmap_mode="r"), floats[some]),
        (np.load(tmp_path / "f.npy", mmap_mode="r")[100:], floats[100:][some]),
        (np.load(tmp_path / "fortran.npy", mmap_mode="r"), floats[some]),
        (floats, floats[some]),
    ):
        assert np.array_equal(take_rows(array, some), expected)
    whole = float(np.asarray(mapped, np.float32).sum())  # every page read, mapped
    assert whole > 0 and rss_file_mib() - before > 32
    release_pages(mapped)
    assert rss_file_mib() - before < 8


def test_a_chunks_rows_are_cut_as_float32_into_memory_tensorflow_shares(
    tmp_path: Path,
) -> None:
    from mgpu_env.training.input.data import as_float32, float32_rows, take_rows
    from mgpu_env.training.input.data.sets import TENSOR_ALIGN_BYTES

    rng = np.random.default_rng(0)
    floats = rng.random((300, 4, 2)).astype(np.float32)
    np.save(tmp_path / "f.npy", floats)
    rows = rng.integers(0, 300, (6, 5))  # (steps, batch)
    for array in (floats, floats.astype(">f4"), (floats * 255).astype(np.uint8),
                  np.load(tmp_path / "f.npy", mmap_mode="r")):
        cut = float32_rows(array, rows)
        assert cut.dtype == np.float32 and cut.shape == (6, 5, 4, 2)
        assert cut.ctypes.data % TENSOR_ALIGN_BYTES == 0
        assert np.array_equal(cut, as_float32(take_rows(array, rows)))


def test_a_stream_from_a_mapped_npy_cuts_the_chunks_the_arrays_hold(
    tmp_path: Path, logical_cpus: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_env.hardware.devices import DeviceSplit
    from mgpu_env.runtime.strategy import make_strategy, plan_strategy
    from mgpu_env.training.input.feeds import arrays_stream as stream

    # Chunks of 5 steps: 8 rows per replica of 8x8 float32 samples and an int32 label.
    monkeypatch.setattr(stream, "STREAM_CHUNK_BYTES", 5 * 8 * (64 + 1) * 4)
    mapped = load("npy", write_npy(tmp_path / "np", train=300))
    assert isinstance(mapped, Arrays) and isinstance(mapped.x_train, np.memmap)
    in_memory = Arrays("same", np.array(mapped.x_train), mapped.y_train, mapped.x_test,
                       mapped.y_test, mapped.num_classes)
    strategy = make_strategy(plan_strategy("auto", DeviceSplit("CPU", 1, 2)))

    def chunks(arrays: Arrays) -> list[np.ndarray]:
        feed = stream.StreamFeed(strategy, arrays, global_batch=16, seed=1,
                                 steps_per_epoch=arrays.train_size // 16)
        return [np.concatenate([v.numpy() for v in strategy.experimental_local_results(x)])
                for x, _ in feed.dataset(Position(0), epochs=2)]

    read, held = chunks(mapped), chunks(in_memory)
    assert len(read) == len(held) > 1
    for a, b in zip(read, held, strict=True):
        assert a.dtype == np.float32 and np.array_equal(a, b)
