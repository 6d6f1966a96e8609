"""`mgpu train` on folders of files, end to end in subprocesses: training, the cached
counts, exact resume of a streamed data set, non-finite numbers and corrupt records
stopping a run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.filedata import (
    flip_record_byte,
    replace_keeping_stat,
    write_images,
    write_npy,
    write_tfrecords,
)
from tests.support.train_process import metrics, run, train_env

pytestmark = pytest.mark.slow

# Runs `mgpu train` with the keep limit at 0, so a small folder streams from its files
# (or a loader's tf.data set streams from its pipeline), as data over 2 GiB does.
STREAMING = (
    "import runpy, sys; import mgpu_env.training.input.keep as k; "
    "import mgpu_env.training.input.data.loader as h; "
    "k.keep_limit = lambda *a, **kw: k.KeepLimit(0, 'test'); h.READ_LIMIT_BYTES = 0; "
    "sys.argv = ['mgpu', 'train']; "
    "runpy.run_module('entrypoint', run_name='__main__')"
)

NAN_LOADER = '''
import os
import numpy as np
import tensorflow as tf

def load():
    rng = np.random.default_rng(0)
    x = rng.random((256, 16), dtype=np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64)
    if os.environ.get("POISON"):
        x[7, 3] = np.nan
    rows = lambda a, b: tf.data.Dataset.from_tensor_slices((a, b))
    return rows(x, y), rows(x[:64], y[:64])
'''


def run_streaming(output_dir: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", STREAMING], env=train_env(output_dir, **settings),
        cwd=output_dir.parent, capture_output=True, text=True, timeout=300, check=False,
    )


def test_tfrecords_train_and_a_second_start_reads_the_cached_counts(tmp_path: Path) -> None:
    folder = write_tfrecords(tmp_path / "data", files=2, per_file=64, test_files=1)
    settings = {"DATASET": f"tfrecord:{folder}", "VIRTUAL_DEVICES": "2", "BATCH_SIZE": "8"}
    started = time.monotonic()
    first = run(tmp_path / "plan", "--dry-run", **settings)
    counted = time.monotonic() - started
    assert first.returncode == 0, first.stderr
    assert "input (8, 8, 1), 4 classes" in first.stdout
    assert (folder / ".mgpu-dataset.json").is_file() and not (tmp_path / "plan").exists()
    started = time.monotonic()
    again = run(tmp_path / "plan", "--dry-run", "--json", **settings)
    cached = time.monotonic() - started
    plan = json.loads(again.stdout)
    assert (plan["train_samples"], plan["test_samples"]) == (128, 64)
    assert plan["input_shape"] == [8, 8, 1] and plan["num_classes"] == 4
    print(f"dry run: counting {counted:.2f} s, cached {cached:.2f} s")
    result = run(tmp_path / "run", EPOCHS="2", **settings)
    assert result.returncode == 0, result.stderr
    found = metrics(tmp_path / "run")
    assert found["train_samples"] == 128 and len(found["history"]) == 2


@pytest.mark.parametrize("kind", ["tfrecord", "npy"])
def test_streamed_files_resume_at_the_epoch_with_the_uninterrupted_losses(
    tmp_path: Path, kind: str
) -> None:
    # TFRecords stream from the files (FileStreamFeed); memory-mapped arrays in chunks
    # (StreamFeed), calls of whole chunks and of a chunk begun by the call before.
    folder = (write_tfrecords(tmp_path / "data", files=3, per_file=48, test_files=1)
              if kind == "tfrecord" else write_npy(tmp_path / "data", train=150))
    settings = {"DATASET": f"{kind}:{folder}", "VIRTUAL_DEVICES": "2", "BATCH_SIZE": "8"}
    straight = run_streaming(tmp_path / "straight", EPOCHS="3", **settings)
    assert straight.returncode == 0, straight.stderr
    stopped = run_streaming(tmp_path / "resumed", EPOCHS="1", **settings)
    assert stopped.returncode == 0, stopped.stderr
    resumed = run_streaming(tmp_path / "resumed", EPOCHS="3", **settings)
    assert resumed.returncode == 0, resumed.stderr
    found, expected = metrics(tmp_path / "resumed"), metrics(tmp_path / "straight")
    assert found["resumed_from_epoch"] == 1
    for key in ("loss", "accuracy"):
        assert [e[key] for e in found["history"]] == [e[key] for e in expected["history"]]
    assert found["test_loss"] == expected["test_loss"]


def test_nan_in_data_read_whole_is_exit_2_before_anything_is_written(tmp_path: Path) -> None:
    folder = write_npy(tmp_path / "data", dtype="float32")
    x = np.load(folder / "x_train.npy")
    x[11, 2, 2] = np.nan
    np.save(folder / "x_train.npy", x)
    result = run(tmp_path / "run", DATASET=f"npy:{folder}")
    assert result.returncode == 2, result.stderr
    assert "1 of the 64 train samples hold NaN or infinite values" in result.stderr
    assert "row 11" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_nan_loss_stops_the_run_keeps_the_last_good_checkpoint_and_resumes(
    tmp_path: Path,
) -> None:
    (tmp_path / "nanloader.py").write_text(NAN_LOADER)
    output = tmp_path / "run"
    settings = {"DATASET": "nanloader:load", "BATCH_SIZE": "16"}  # found in the cwd
    assert run_streaming(output, EPOCHS="1", **settings).returncode == 0
    # The streamed rows are not checked up front: the poisoned row is met in epoch 2.
    poisoned = run_streaming(output, EPOCHS="3", POISON="1", **settings)
    assert poisoned.returncode == 1, poisoned.stderr
    # On the CPU, ReLU turns the NaN into 0 and the loss stays finite (at chance): the
    # first layer's weights, NaN through their gradient, are what stop the run.
    assert ("loss became nan in epoch 2" in poisoned.stderr
            or "weights became NaN or infinite" in poisoned.stderr), poisoned.stderr
    assert "in epoch 2 (within its first" in poisoned.stderr
    assert "the checkpoint of epoch 1 is kept" in poisoned.stderr
    assert "Traceback" not in poisoned.stderr
    assert sorted(p.name for p in (output / "checkpoints").glob("*.index")) == ["ckpt-1.index"]
    assert metrics(output)["epochs_completed"] == 1  # the finished first run's, untouched
    resumed = run_streaming(output, EPOCHS="3", **settings)
    assert resumed.returncode == 0, resumed.stderr
    assert metrics(output)["resumed_from_epoch"] == 1


def assert_stopped_keeping_epoch_1(result: subprocess.CompletedProcess[str], output: Path
                                   ) -> None:
    assert result.returncode == 1, result.stderr
    assert "in epoch 2: training stopped" in result.stderr
    assert "the checkpoint of epoch 1 is kept" in result.stderr
    assert "Traceback" not in result.stderr and "{{" not in result.stderr
    assert sorted(p.name for p in (output / "checkpoints").glob("*.index")) == ["ckpt-1.index"]
    assert metrics(output)["epochs_completed"] == 1  # the finished first run's, untouched
    assert len(json.loads((output / "history.json").read_text())["epochs"]) == 1


def test_a_corrupt_record_met_in_a_stream_names_the_file_and_the_run_resumes_once_fixed(
    tmp_path: Path,
) -> None:
    folder = write_tfrecords(tmp_path / "data", files=3, per_file=48, test_files=1)
    output = tmp_path / "run"
    settings = {"DATASET": f"tfrecord:{folder}", "VIRTUAL_DEVICES": "2", "BATCH_SIZE": "8"}
    assert run_streaming(output, EPOCHS="1", **settings).returncode == 0  # counted, cached
    damaged = sorted(folder.glob("*train*"))[1]
    original = flip_record_byte(damaged, record=20)  # its size and mtime kept: still cached
    stopped = run_streaming(output, EPOCHS="3", **settings)
    assert_stopped_keeping_epoch_1(stopped, output)
    assert f"{damaged} record 20 cannot be read" in stopped.stderr
    assert "corrupted record" in stopped.stderr and ".mgpu-dataset.json" in stopped.stderr
    damaged.write_bytes(original)  # a new mtime: counted and checked again
    resumed = run_streaming(output, EPOCHS="3", **settings)
    assert resumed.returncode == 0, resumed.stderr
    assert metrics(output)["resumed_from_epoch"] == 1


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "kept"])
def test_an_image_that_no_longer_decodes_names_the_file_and_the_run_resumes_once_fixed(
    tmp_path: Path, streamed: bool,
) -> None:
    folder = write_images(tmp_path / "data", per_class=16, test_per_class=4)
    output = tmp_path / "run"
    train = run_streaming if streamed else run
    settings = {"DATASET": f"images:{folder}", "BATCH_SIZE": "8"}
    assert train(output, EPOCHS="1", **settings).returncode == 0
    damaged = folder / "train" / "dog" / "5.png"
    original = damaged.read_bytes()
    replace_keeping_stat(damaged, original[:40] + bytes(len(original) - 40))  # cut short
    stopped = train(output, EPOCHS="3", **settings)
    assert_stopped_keeping_epoch_1(stopped, output)
    assert f"{damaged} cannot be decoded (Invalid PNG" in stopped.stderr
    damaged.write_bytes(original)
    resumed = train(output, EPOCHS="3", **settings)
    assert resumed.returncode == 0, resumed.stderr
    assert metrics(output)["resumed_from_epoch"] == 1
