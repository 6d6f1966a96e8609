"""The two phases of a run: the plan is pure (no TensorFlow, no data read), the feed is
decided once (`feeds.plan_feed`), and the summary shows it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.training.input.data import Arrays, DataSizes, FileData, Streamed
from mgpu_env.training.input.data.sets import FilePart, Layout, RowStream
from mgpu_env.training.input.feeds import plan_feed
from mgpu_env.training.input.keep import GIB, KeepLimit
from tests.support.children import REPO
from tests.support.filedata import write_npy

MNIST_BYTES = 60_000 * 785 * 4  # float32 samples of 784 values and int32 labels


def _files(files: int = 4, per_file: int = 100) -> FileData:
    part = FilePart(tuple(f"/data/{i}.tfrecord" for i in range(files)), (per_file,) * files)
    return FileData("tfrecord:/data", "tfrecord", Path("/data"), Layout(), part,
                    FilePart(("/data/test.tfrecord",), (50,)), (8, 8, 1), 4)


def test_rows_within_the_keep_limit_are_kept_and_over_it_stream() -> None:
    mnist = DataSizes(60_000, 10_000)
    kept = plan_feed(mnist, KeepLimit(2 * GIB, "test"), global_batch=64)
    assert (kept.kind, kept.steps_per_epoch) == ("resident", 937)
    assert kept.why == "60,000 rows (188 MB) fit the keep limit of 2.0 GiB on each device"
    streamed = plan_feed(mnist, KeepLimit(MNIST_BYTES - 1, "test"), global_batch=64)
    assert (streamed.kind, streamed.steps_per_epoch) == ("stream", 937)
    assert streamed.why.endswith("are over the keep limit of 0.2 GiB on each device: they "
                                 "stream from host memory")
    assert plan_feed(mnist, KeepLimit(MNIST_BYTES, "test"), 64).kind == "resident"


def test_arrays_are_decided_as_their_sizes_are() -> None:
    x = np.zeros((100, 3), np.float32)
    arrays = Arrays("a", x, np.zeros(100, np.int32), x[:10], np.zeros(10, np.int32))
    limit = KeepLimit(100 * 4 * 4, "test")
    assert plan_feed(arrays, limit, 10) == plan_feed(DataSizes(100, 10, (3,)), limit, 10)
    assert plan_feed(arrays, KeepLimit(0, "test"), 10).kind == "stream"


def test_a_loaders_stream_streams_from_its_pipeline_whatever_the_limit() -> None:
    rows = RowStream(rows=None, size=1_000, sample_shape=(4,), max_label=2)
    feed = plan_feed(Streamed("m:load", rows, rows, 3), KeepLimit(100 * GIB, "test"), 64)
    assert (feed.kind, feed.steps_per_epoch) == ("row_stream", 15)
    assert "stream from its pipeline" in feed.why


def test_files_are_read_whole_within_the_limit_and_streamed_by_file_over_it() -> None:
    data = _files(files=3, per_file=100)
    kept = plan_feed(data, KeepLimit(GIB, "test"), global_batch=32, workers=2)
    assert (kept.kind, kept.steps_per_epoch) == ("resident", 9)
    assert "decoded rows" in kept.why and "read whole" in kept.why
    streamed = plan_feed(data, KeepLimit(0, "test"), global_batch=32, workers=2)
    # Worker 1 reads 1 file of 100 records, 16 a step: 6 whole steps for every worker.
    assert (streamed.kind, streamed.steps_per_epoch) == ("file_stream", 6)
    assert streamed.why.endswith("each worker streams its share of the files")


PURE_PLAN = """
import sys
from mgpu_env.training.input.data import resolve as resolve_module
from mgpu_env.training.input.data import files as files_module

def refuse(*args, **kwargs):
    raise AssertionError("the plan read the data")

resolve_module.load_data = refuse
files_module.load_files = refuse
resolve_module.load_files = refuse
from mgpu_env.training.run.plan import plan_training
from tests.support.runtimes import runtime_of

plan = plan_training(runtime_of({{"GPUS": "none", "DATASET": {dataset!r},
                                  "OUTPUT_DIR": {output!r}}}), environ={{}})
print(plan.sizes, "feed" in vars(plan), "tensorflow" in sys.modules, "keras" in sys.modules)
"""

LOADER = """
def load():
    raise SystemExit("the loader was called")
"""


@pytest.mark.parametrize("origin", ["hook", "files"])
def test_the_plan_of_a_loaders_or_a_folders_data_starts_no_tensorflow_and_reads_nothing(
    tmp_path: Path, origin: str
) -> None:
    if origin == "hook":
        (tmp_path / "pure_loader.py").write_text(LOADER)
        dataset = "pure_loader:load"
    else:
        dataset = f"npy:{write_npy(tmp_path / 'data')}"
    script = PURE_PLAN.format(dataset=dataset, output=str(tmp_path / "run"))
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{REPO}",
             "HOME": str(tmp_path)}, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "False", "False", "False"]
    assert not (tmp_path / "data" / ".mgpu-dataset.json").exists()
    assert not (tmp_path / "run").exists()


def test_the_dry_run_shows_the_feed_and_its_json_has_it(tmp_path: Path) -> None:
    env = {"GPUS": "none", "DATASET": "digits", "OUTPUT_DIR": str(tmp_path / "run")}
    result = CliRunner().invoke(app, ["train", "--dry-run"], env=env)
    assert result.exit_code == 0, result.output
    feed = [line for line in result.stdout.splitlines() if line.startswith("  feed ")]
    assert len(feed) == 1, result.stdout
    assert feed[0].startswith("  feed           resident (1,437 rows (5 MB) fit the keep "
                              "limit of "), feed
    assert feed[0].endswith(" GiB on each device)")
    as_json = CliRunner().invoke(app, ["train", "--dry-run", "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    found = json.loads(as_json.stdout)["feed"]
    assert (found["kind"], found["steps_per_epoch"]) == ("resident", 22)
    assert found["why"] in feed[0]


COUNTED_LOADER = """
import numpy as np

CALLS = []

def load():
    CALLS.append(1)
    x = np.zeros((300, 6), dtype="float32")
    y = np.arange(300) % 3
    return (x[:200], y[:200]), (x[200:], y[200:])
"""


@pytest.mark.slow
def test_prepare_starts_tensorflow_once_and_loads_the_data_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logical_cpus: tuple[str, ...]
) -> None:
    # The loader's contract check imports TensorFlow: its devices are split first
    # (`logical_cpus`), as for every in-process test that uses it.
    import importlib

    from mgpu_env.runtime import Execution
    from mgpu_env.training.run.plan import plan_training
    from mgpu_env.training.run.prepare import prepare
    from tests.support.runtimes import runtime_of

    (tmp_path / "counted_loader.py").write_text(COUNTED_LOADER)
    monkeypatch.syspath_prepend(str(tmp_path))
    started: list[int] = []
    monkeypatch.setattr(Execution, "prepare_tensorflow", lambda self: started.append(1))
    plan = plan_training(runtime_of({"GPUS": "none", "DATASET": "counted_loader:load",
                                     "BATCH_SIZE": "50", "OUTPUT_DIR": str(tmp_path / "run")}),
                         environ={})
    loader = importlib.import_module("counted_loader")
    assert (plan.sizes, "feed" in vars(plan), loader.CALLS, started) == (None, False, [], [])
    prepared = prepare(plan)
    assert (loader.CALLS, started) == ([1], [1])
    shape = prepared.data_plan
    assert (shape.train_size, shape.test_size) == (200, 100)
    assert shape.input_shape == (6,) and shape.num_classes == 3
    assert (shape.feed.kind, shape.steps_per_epoch) == ("resident", 4)
    assert prepared.data.train_size == 200
