"""A finished run started again: "Nothing to do", said from the run folder's files before
TensorFlow is imported, naming the run and when it finished; anything uncertain goes the
usual way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mgpu_env.runtime import Runtime, build_runtime
from mgpu_env.training.run.finished import finished_run
from mgpu_env.training.run.resume import resolve_run_settings
from mgpu_env.training.run.rundir import latest_checkpoint_epoch
from tests.support.children import REPO
from tests.support.train_process import train_env

pytestmark = pytest.mark.slow


def _env(output_dir: Path, **settings: str) -> dict[str, str]:
    return train_env(output_dir, **{"EPOCHS": "1", **settings})


def _train(output_dir: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", "train"], env=_env(output_dir, **settings),
        cwd=output_dir.parent, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run of one epoch, trained to the end."""
    output = tmp_path_factory.mktemp("finished") / "run"
    result = _train(output)
    assert result.returncode == 0, result.stderr
    assert json.loads((output / "metrics.json").read_text())["status"] == "finished"
    return output


def test_a_finished_run_is_answered_without_tensorflow(finished: Path, tmp_path: Path) -> None:
    # A `tensorflow` that cannot be imported, first on the path: the answer must not need it.
    blocker = tmp_path / "blocker" / "tensorflow"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('TensorFlow was imported')\n")
    before = (finished / "metrics.json").read_bytes()
    started = time.monotonic()
    again = _train(finished, PYTHONPATH=f"{blocker.parent}{os.pathsep}{REPO}")
    seconds = time.monotonic() - started
    assert again.returncode == 0, again.stderr
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC",
                          time.gmtime((finished / "metrics.json").stat().st_mtime))
    accuracy = json.loads(before)["test_accuracy"]
    assert again.stdout.splitlines()[0] == (
        f"Nothing to do: {finished} holds this run, finished at {stamp} after 1 epoch, "
        f"test accuracy {accuracy:.4f} (its metrics.json)."
    )
    assert "Done:" not in again.stdout and again.stderr == ""
    assert (finished / "metrics.json").read_bytes() == before
    # TensorFlow's import alone takes longer than this on the machines the tests run on.
    assert seconds < 15, f"{seconds:.1f} s"


def _runtime(output: Path, **settings: str) -> Runtime:
    environ = _env(output, **settings)
    resolved = resolve_run_settings({}, environ)
    return build_runtime(resolved, environ, command="train")


def test_only_the_certain_case_takes_the_short_way(finished: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    assert finished_run(_runtime(copy)) is not None
    assert latest_checkpoint_epoch(copy) == 1
    # More epochs asked for: it trains on, the usual way.
    assert finished_run(_runtime(copy, EPOCHS="3")) is None
    # Another identity: the usual way refuses it, with its own message.
    assert finished_run(_runtime(copy, LEARNING_RATE="0.01")) is None
    # A later checkpoint than the finished epochs (a longer run stopped): the usual way.
    index = copy / "checkpoints" / "checkpoint"
    text = index.read_text()
    index.write_text(text.replace('"ckpt-1"', '"ckpt-3"'))
    assert latest_checkpoint_epoch(copy) == 3
    assert finished_run(_runtime(copy)) is None
    index.write_text(text)
    # metrics.json that cannot be read: the usual way, which says what is wrong with it.
    (copy / "metrics.json").write_text("{not json")
    assert finished_run(_runtime(copy)) is None
