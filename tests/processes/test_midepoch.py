"""Checkpoints inside an epoch (CHECKPOINT_EVERY): each feed resumes at the checkpoint's step
with no row seen twice or skipped, and a run stopped at any step (SIGTERM, or kill -9 between
checkpoints) resumes to the uninterrupted run's losses and weights, to the bit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mgpu_env.config.parsers import CheckpointInterval, SettingError, parse_checkpoint_every
from mgpu_env.training.run import rundir
from mgpu_env.training.run.checkpoints import Schedule
from mgpu_env.training.shared.position import Position
from tests.support.feeds import rows_seen
from tests.support.filedata import write_npy, write_tfrecords
from tests.support.train_process import metrics, train_env

# ------------------------------------------------------------------- the setting, the plan


@pytest.mark.parametrize(("text", "interval", "shown"), [
    ("0", CheckpointInterval(), "epoch"), ("epoch", CheckpointInterval(), "epoch"),
    (" Epoch ", CheckpointInterval(), "epoch"), ("1", CheckpointInterval(steps=1), "1"),
    ("500", CheckpointInterval(steps=500), "500"),
    ("1s", CheckpointInterval(seconds=1), "1s"), ("90s", CheckpointInterval(seconds=90), "90s"),
    ("10m", CheckpointInterval(seconds=600), "10m"), ("1.5h", CheckpointInterval(seconds=5400),
                                                      "90m"),
    ("168h", CheckpointInterval(seconds=604_800), "168h"), ("2.5s", CheckpointInterval(
        seconds=2.5), "2.5s"),
])
def test_every_form_of_checkpoint_every_parses_and_reads_back(
    text: str, interval: CheckpointInterval, shown: str
) -> None:
    assert parse_checkpoint_every(text) == interval
    assert str(interval) == shown and parse_checkpoint_every(shown) == interval


@pytest.mark.parametrize(("text", "why"), [
    ("", "neither a number of steps nor a time"), ("-5", "neither"), ("10d", "neither"),
    ("ten", "neither"), ("xm", "'x' before the unit is not a number"),
    ("0s", "at least 1s"), ("0.5s", "at least 1s"), ("169h", "at most 168h"),
    ("infm", "before the unit is not a number"), ("9e999s", "at least 1s"),
    ("1000000001", "more than 1,000,000,000 steps"),
])
def test_a_bad_checkpoint_every_says_why(text: str, why: str) -> None:
    with pytest.raises(SettingError, match=why):
        parse_checkpoint_every(text)


def test_a_bad_checkpoint_every_is_exit_2_naming_the_value_and_the_valid_ones() -> None:
    from typer.testing import CliRunner

    from entrypoint.app import app

    result = CliRunner().invoke(app, ["train", "--dry-run"],
                                env={"CHECKPOINT_EVERY": "10 minutes"})
    assert result.exit_code == 2, result.output
    assert "CHECKPOINT_EVERY='10 minutes'" in result.stderr
    assert "Valid: 0 or epoch" in result.stderr and "Fix:" in result.stderr
    assert "90s, 10m, 1h" in result.stderr and "Traceback" not in result.output


def test_calls_end_where_a_save_is_asked_and_nowhere_else() -> None:
    # 44 steps an epoch, a save every 10 steps of the run: epoch 2 (0-based 1) saves after
    # its steps 6, 16, 26 and 36; calls also end at the epoch's end.
    schedule = Schedule(CheckpointInterval(steps=10), steps_per_epoch=44)
    ends, done = [], 0
    while done < 44:
        done += schedule.call_steps(Position(1, done))
        ends.append(done)
    assert ends == [6, 16, 26, 36, 44]
    assert [d for d in ends if schedule.due(Position(1, d))] == [6, 16, 26, 36]  # not at the end
    # A time: calls of STEPS_PER_CALL (200), due once the time has passed.
    by_time = Schedule(CheckpointInterval(seconds=60), steps_per_epoch=1000, last_save=0.0)
    assert [by_time.call_steps(Position(0, d)) for d in (0, 200, 900, 950)] == [200, 200, 100, 50]
    assert by_time.due(Position(0, 200))
    assert not Schedule(CheckpointInterval(), 1000).due(Position(0, 200))


def test_a_checkpoints_name_says_where_the_run_stands(tmp_path: Path) -> None:
    directory = tmp_path / rundir.CHECKPOINT_DIR
    directory.mkdir()
    for position in (Position(3), Position(2, 150)):
        (directory / "checkpoint").write_text(f'model_checkpoint_path: "{position.name}"\n')
        assert rundir.latest_checkpoint_position(tmp_path) == position
        assert rundir.latest_checkpoint_epoch(tmp_path) == position.epoch
    assert Position(2, 150).describe() == "step 150 of epoch 3"
    (directory / "checkpoint").write_text('model_checkpoint_path: "ckpt-2-x"\n')
    with pytest.raises(Exception, match="not a checkpoint mgpu wrote"):
        rundir.latest_checkpoint_position(tmp_path)


# ------------------------------------------------------------- each feed's position, in process


@pytest.mark.parametrize("feed_kind", ["resident", "stream", "rows"])
def test_a_feed_started_at_a_step_trains_the_rest_of_the_order_once(
    logical_cpus: tuple[str, ...], feed_kind: str
) -> None:
    from mgpu_env.hardware.devices import DeviceSplit
    from mgpu_env.runtime.strategy import make_strategy, plan_strategy
    from mgpu_env.training.input.order import epoch_order

    size, global_batch = 250, 16  # 15 steps; 10 rows of each epoch left out
    for replicas in (1, 2):
        strategy = make_strategy(plan_strategy("auto", DeviceSplit("CPU", 1, replicas)))
        whole, before, after = rows_seen(strategy, feed_kind, size, global_batch,
                                          [(0, 15), (0, 6), (6, 9)])
        # The run stopped after step 6 and resumed there: every row of the epoch once.
        np.testing.assert_array_equal(before + after, whole)
        assert set(np.unique(whole)) == {0.0, 1.0} and whole.sum() == 15 * global_batch
        if feed_kind != "rows":  # a loader's rows follow its shuffle buffer, not the order
            order = epoch_order(3, 1, size, global_batch)
            np.testing.assert_array_equal(np.flatnonzero(before), np.sort(order[:96]))
            np.testing.assert_array_equal(np.flatnonzero(after), np.sort(order[96:]))


# ------------------------------------------------------------------------ whole runs, stopped

# The stop at a chosen call end: an action put before the run's own (STOP_AT=SIGNAL:epoch:step).
STOP_HOOK = """
import mgpu_env.training.run.loop as loop
name, epoch, step = os.environ["STOP_AT"].split(":")
actions = loop.after_call_actions
def stop(call):
    if (call.epoch, call.done) == (int(epoch), int(step)):
        os.kill(os.getpid(), getattr(signal, name))
loop.after_call_actions = lambda *a, **kw: [stop, *actions(*a, **kw)]
"""

# `mgpu train` in a child that can stream small data (the keep limit at 0, as over 2 GiB) and
# sends itself a real signal (STOP_AT=SIGNAL:epoch:step, 0-based epoch) at that call's end,
# before the run's own actions: a stop at a step the test chooses, not the machine's load.
CHILD = """
import os, runpy, signal, sys
if os.environ.get("STREAM"):
    import mgpu_env.training.input.keep as k, mgpu_env.training.input.data.loader as h
    k.keep_limit = lambda *a, **kw: k.KeepLimit(0, "test"); h.READ_LIMIT_BYTES = 0
if os.environ.get("STOP_AT"):
""" + textwrap.indent(STOP_HOOK, "    ") + """sys.argv = ["mgpu", "train"]
runpy.run_module("entrypoint", run_name="__main__")
"""

LOADER = """
import numpy as np, tensorflow as tf
def load():
    rng = np.random.default_rng(0)
    x = rng.random((700, 16), dtype=np.float32)
    y = (x[:, 0] * 4).astype(np.int64)
    rows = lambda a, b: tf.data.Dataset.from_tensor_slices((a, b))
    return rows(x, y), rows(x[:64], y[:64])
"""


def _train(output_dir: Path, stop_at: str = "", **settings: str
           ) -> subprocess.CompletedProcess[str]:
    # Unbuffered: a child killed with SIGKILL still leaves what it printed.
    env = train_env(output_dir, STOP_AT=stop_at, PYTHONUNBUFFERED="1", QUIET="0", **settings)
    return subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=output_dir.parent,
                          capture_output=True, text=True, timeout=300, check=False)


def _weights(output_dir: Path, name: str) -> str:
    """The variables of a checkpoint, hashed (the save counter left out: a resumed run saved
    more). Read in this process: the checkpoint reader starts no device."""
    import hashlib

    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(output_dir / rundir.CHECKPOINT_DIR / name))
    digest = hashlib.sha256()
    for variable in sorted(reader.get_variable_to_shape_map()):
        if "save_counter" not in variable and "OBJECT_GRAPH" not in variable:
            digest.update(variable.encode() + reader.get_tensor(variable).tobytes())
    return digest.hexdigest()


def _feed_settings(tmp_path: Path, feed: str) -> dict[str, str]:
    """Two replicas, a global batch of 32, and 3 epochs of a feed of each kind."""
    common = {"EPOCHS": "3", "CHECKPOINT_EVERY": "10", "VIRTUAL_DEVICES": "2"}
    if feed == "resident":
        return {**common, "DATASET": "digits", "BATCH_SIZE": "16"}  # 44 steps an epoch
    if feed == "files":
        folder = write_tfrecords(tmp_path / "data", files=3, per_file=200, test_files=1)
        return {**common, "DATASET": f"tfrecord:{folder}", "BATCH_SIZE": "16", "STREAM": "1"}
    if feed == "chunks":
        folder = write_npy(tmp_path / "data", train=600)
        return {**common, "DATASET": f"npy:{folder}", "BATCH_SIZE": "16", "STREAM": "1"}
    (tmp_path / "rows_loader.py").write_text(LOADER)
    return {**common, "DATASET": "rows_loader:load", "BATCH_SIZE": "16", "STREAM": "1",
            "PYTHONPATH": str(tmp_path)}


@pytest.mark.slow
@pytest.mark.parametrize("feed", ["resident", "files", "chunks", "rows"])
def test_a_run_stopped_inside_epochs_resumes_to_the_uninterrupted_bits(
    tmp_path: Path, feed: str
) -> None:
    settings = _feed_settings(tmp_path, feed)
    straight = tmp_path / "straight" / "run"
    straight.parent.mkdir()
    result = _train(straight, **settings)
    assert result.returncode == 0, result.stderr
    assert "every 10 steps (CHECKPOINT_EVERY=10)" in result.stdout
    steps = int(result.stdout.split(" steps per epoch")[0].rsplit(" ", 1)[1])
    # The ends of calls in epoch `epoch` (0-based): the saves, every 10 steps of the run.
    def saves(epoch: int) -> list[int]:
        return [d for d in range(1, steps) if (epoch * steps + d) % 10 == 0]

    stopped = tmp_path / "stopped" / "run"
    stopped.parent.mkdir()
    # SIGTERM at the end of a call in epoch 2: the stop saves there and says so.
    term_at = saves(1)[-1]
    term = _train(stopped, f"SIGTERM:1:{term_at}", **settings)
    assert term.returncode == 143, term.stderr
    assert f"the checkpoint at step {term_at} of epoch 2 is saved" in term.stderr
    assert rundir.latest_checkpoint_position(stopped) == Position(1, term_at)
    # kill -9 between checkpoints in epoch 3 (before the save at its step): the one before
    # it, 10 steps earlier, is resumed.
    kill_at = saves(2)[1]
    killed = _train(stopped, f"SIGKILL:2:{kill_at}", **settings)
    assert killed.returncode == -9, killed.stderr
    assert (f"Resuming from the checkpoint of epoch 1 and {term_at} steps (step {term_at} "
            "of epoch 2)") in killed.stdout
    assert rundir.latest_checkpoint_position(stopped) == Position(2, kill_at - 10)
    resumed = _train(stopped, **settings)
    assert resumed.returncode == 0, resumed.stderr
    assert f"and {kill_at - 10} steps (step {kill_at - 10} of epoch 3)" in resumed.stdout

    found, expected = metrics(stopped), metrics(straight)
    assert (found["resumed_from_epoch"], found["resumed_from_step"]) == (2, kill_at - 10)
    for key in ("loss", "accuracy"):
        assert [e[key] for e in found["history"]] == [e[key] for e in expected["history"]]
    assert found["test_loss"] == expected["test_loss"]
    assert _weights(stopped, "ckpt-3") == _weights(straight, "ckpt-3")
    assert found["checkpoint"]["every"] == "10" and found["checkpoint"]["saves"] >= 2
    assert found["checkpoint"]["mb"] > 0 and found["checkpoint"]["mean_seconds"] > 0


# A worker's own signal, sent by the worker STOP_WORKER names alone (`sitecustomize` runs in
# every process the launcher starts): the other worker never receives it.
WORKER_STOP = """
import os, signal
if os.environ.get("STOP_AT") and os.environ.get("WORKER_INDEX") == os.environ["STOP_WORKER"]:
""" + textwrap.indent(STOP_HOOK, "    ")


@pytest.mark.slow
def test_two_workers_stopped_inside_an_epoch_resume_to_the_uninterrupted_bits(
    tmp_path: Path
) -> None:
    from tests.support.children import REPO

    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(WORKER_STOP)

    def workers(output_dir: Path, stop_at: str = "") -> subprocess.CompletedProcess[str]:
        env = train_env(output_dir, EPOCHS="2", CHECKPOINT_EVERY="10", BATCH_SIZE="16",
                        STOP_AT=stop_at, STOP_WORKER="1", QUIET="0",
                        PYTHONPATH=f"{tmp_path / 'inject'}:{REPO}", TMPDIR=str(tmp_path))
        return subprocess.run(
            [sys.executable, "-m", "entrypoint", "train", "--workers", "2"], env=env,
            cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)

    straight = tmp_path / "straight"
    result = workers(straight)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # Digits, a global batch of 32 on 2 workers: 44 steps an epoch; a save every 10 steps
    # of the run. Worker 1 alone is sent SIGTERM after step 16 of epoch 2 (run step 60):
    # both agree to save there and stop.
    stopped = tmp_path / "stopped"
    term = workers(stopped, "SIGTERM:1:16")
    assert term.returncode == 143, term.stdout[-3000:] + term.stderr[-3000:]
    assert "[worker 0] SIGTERM received: training stopped during epoch 2 of 2; the " \
           "checkpoint at step 16 of epoch 2 is saved" in term.stderr
    assert rundir.latest_checkpoint_position(stopped) == Position(1, 16)
    resumed = workers(stopped)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    found, expected = metrics(stopped), metrics(straight)
    assert (found["resumed_from_epoch"], found["resumed_from_step"]) == (1, 16)
    for key in ("loss", "accuracy"):
        assert [e[key] for e in found["history"]] == [e[key] for e in expected["history"]]
    assert found["test_loss"] == expected["test_loss"]
    assert _weights(stopped, "ckpt-2") == _weights(straight, "ckpt-2")


def test_a_checkpoint_from_before_checkpoints_inside_the_epoch_still_resumes(
    logical_cpus: tuple[str, ...], tmp_path: Path
) -> None:
    import tensorflow as tf

    from mgpu_env.hardware.devices import DeviceSplit
    from mgpu_env.runtime.precision import FLOAT32, PrecisionChoice
    from mgpu_env.runtime.strategy import make_strategy, plan_strategy
    from mgpu_env.training.run.checkpoints import Checkpoints
    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.model import build_model
    from mgpu_env.training.step.steps import StepSpec

    def trainer(seed: int) -> Any:
        return build_trainer(
            make_strategy(plan_strategy("auto", DeviceSplit("CPU", 1))),
            lambda: build_model(seed),
            StepSpec(learning_rate=0.01, precision=PrecisionChoice(FLOAT32, False, "test"),
                     global_batch_size=16, jit_compile=False))

    old = trainer(1)
    with old.strategy.scope():
        epoch = tf.Variable(2, dtype=tf.int64, trainable=False)
    # What mgpu wrote before: the model, the optimizer and the epoch, as ckpt-<epoch>.
    tf.train.CheckpointManager(
        tf.train.Checkpoint(model=old.model, optimizer=old.optimizer, epoch=epoch),
        str(tmp_path), max_to_keep=3, checkpoint_name="ckpt").save(checkpoint_number=2)
    new = trainer(2)
    assert Checkpoints(new, tmp_path).restore() == Position(2, 0)
    for restored, saved in zip(new.model.weights, old.model.weights, strict=True):
        np.testing.assert_array_equal(restored.numpy(), saved.numpy())


class _SlowOrBrokenCheckpoints:
    """Checkpoints whose save takes `seconds`, or fails."""

    latest = "runs/x/checkpoints/ckpt-2"

    def __init__(self, seconds: float = 0.0, fails: bool = False) -> None:
        self.seconds, self.fails = seconds, fails
        self.saved: list[Position] = []

    def save(self, position: Position) -> None:
        import time

        time.sleep(self.seconds)
        if self.fails:
            raise OSError("No space left on device")
        self.saved.append(position)


class _Session:
    tag = "[worker 0] "

    def progress(self, phase: str | None = None) -> None:
        pass


def test_a_save_at_a_stop_that_takes_long_or_fails_is_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mgpu_env.training.run import epochs
    from mgpu_env.training.run.progress import Progress
    from mgpu_env.training.run.signals import StopRequest

    monkeypatch.setattr(epochs, "STOP_SAVE_TOLD_AFTER_S", 0.05)
    stopping = epochs.Stopping(StopRequest(15), 5, 0.001, "OUTPUT_DIR=runs/x mgpu train")

    def saving(checkpoints: Any) -> Any:
        return epochs.Saving(checkpoints, Schedule(CheckpointInterval(), 100),
                             lambda flags: flags, _Session(), Progress())

    slow = _SlowOrBrokenCheckpoints(seconds=0.3)
    assert epochs.save_inside_epoch(saving(slow), Position(2, 40), stopping)
    assert slow.saved == [Position(2, 40)]
    told = capsys.readouterr().err
    assert told.startswith("[worker 0] Still saving the checkpoint at step 40 of epoch 3 "
                           "after 0.05 s; if the process is killed before it finishes, the "
                           "previous one is resumed (runs/x/checkpoints/ckpt-2)."), told
    # A quick save says nothing; a failed one says so, and the stop goes on.
    assert epochs.save_inside_epoch(saving(_SlowOrBrokenCheckpoints()), Position(2, 60),
                                    stopping)
    assert capsys.readouterr().err == ""
    broken = _SlowOrBrokenCheckpoints(fails=True)
    assert not epochs.save_inside_epoch(saving(broken), Position(2, 60), stopping)
    assert ("The checkpoint at step 60 of epoch 3 could not be saved (OSError: No space "
            "left on device); the previous one is kept.") in capsys.readouterr().err
    # A save that is not a stop's raises its error.
    with pytest.raises(OSError, match="No space"):
        epochs.save_inside_epoch(saving(broken), Position(2, 60), None)
    with pytest.raises(epochs.Interrupted) as stopped:
        epochs.raise_interrupted(stopping, Position(2, 60), saved=True)
    assert str(stopped.value) == (
        "SIGTERM received: training stopped during epoch 3 of 5; the checkpoint at step 60 "
        "of epoch 3 is saved.\n  Resume with: OUTPUT_DIR=runs/x mgpu train")
    assert stopped.value.exit_code == 143
    # Its save failed: the stop names the checkpoint kept from before, of the same epoch.
    with pytest.raises(epochs.Interrupted) as unsaved:
        epochs.raise_interrupted(stopping, Position(2, 60), saved=False)
    assert (f"during epoch 3 of 5; {epochs.rundir.checkpoint_kept(2)}.\n"
            in str(unsaved.value))
