"""A run stopped anywhere inside an epoch resumes to the uninterrupted run's bits: the epoch's
running loss and accuracy (each replica's own metric state, saved and restored as it is), the
weights and the optimizer's state, at 1, 2 and 4 replicas for every kind of feed.

In process, on the built-in digits: one uninterrupted epoch saves a checkpoint (a folder each)
after many of its steps; each is then restored into the same trainer (its metrics reset
first, so nothing of the uninterrupted run is left in them) and the rest of the epoch trained
in one call, as a resumed run does. Every stop point is compared, not only those where
rounding happens to agree.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.filedata import write_tfrecords

GLOBAL_BATCH = 32  # every replica count trains the same global batches: 44 steps of digits


def _feed(strategy: Any, kind: str, tmp_path: Path) -> tuple[Any, tuple[int, ...], int]:
    """A feed of `kind` over small data, its samples' shape and its classes."""
    from mgpu_env.training.input.data.builtin import _load_digits
    from mgpu_env.training.input.data.files import load_files
    from mgpu_env.training.input.feeds import (
        FeedMaking,
        ResidentFeed,
        RowStreamFeed,
        StreamFeed,
        make_feed,
        plan_feed,
    )
    from mgpu_env.training.input.keep import KeepLimit

    if kind == "files":
        folder = write_tfrecords(tmp_path / "data", files=3, per_file=200, test_files=1)
        data = load_files(f"tfrecord:{folder}", "tfrecord", folder)
        plan = plan_feed(data, KeepLimit(0, "test"), GLOBAL_BATCH)
        feed = make_feed(FeedMaking(strategy, data, plan, GLOBAL_BATCH, seed=3))
        return feed, tuple(data.sample_shape), int(data.num_classes)
    import tensorflow as tf

    arrays = _load_digits(0)
    per_epoch = len(arrays.y_train) // GLOBAL_BATCH
    shape, classes = (arrays.x_train.shape[1],), 10
    if kind == "resident":
        feed = ResidentFeed.place(strategy, arrays, GLOBAL_BATCH, seed=3,
                                  steps_per_epoch=per_epoch)
    elif kind == "stream":
        feed = StreamFeed(strategy, arrays, GLOBAL_BATCH, seed=3, steps_per_call=8,
                          steps_per_epoch=per_epoch)
    else:
        rows = tf.data.Dataset.from_tensor_slices((arrays.x_train, arrays.y_train))
        feed = RowStreamFeed(strategy, rows, len(arrays.y_train), GLOBAL_BATCH, seed=3,
                             steps_per_epoch=per_epoch)
    return feed, shape, classes


def _state(trainer: Any) -> str:
    """The weights' and the optimizer's values, hashed."""
    digest = hashlib.sha256()
    for v in [*trainer.model.variables, *trainer.optimizer.variables]:
        digest.update(np.asarray(v.numpy()).tobytes())
    return digest.hexdigest()


def _metrics(trainer: Any) -> tuple[float, float]:
    steps = trainer.steps
    return float(steps.train_loss.result()), float(steps.train_accuracy.result())


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2, 4])
@pytest.mark.parametrize("kind", ["resident", "stream", "rows", "files"])
def test_a_run_stopped_at_any_step_of_an_epoch_resumes_to_the_same_bits(
    logical_cpus: tuple[str, ...], tmp_path: Path, kind: str, replicas: int
) -> None:
    from mgpu_env.hardware.devices import DeviceSplit
    from mgpu_env.runtime.precision import FLOAT32, PrecisionChoice
    from mgpu_env.runtime.strategy import make_strategy, plan_strategy
    from mgpu_env.training.run.checkpoints import Checkpoints
    from mgpu_env.training.shared.position import Position
    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.model import build_model
    from mgpu_env.training.step.steps import StepSpec

    strategy = make_strategy(plan_strategy("auto", DeviceSplit("CPU", 1, replicas)))
    feed, shape, classes = _feed(strategy, kind, tmp_path)
    trainer = build_trainer(strategy, lambda: build_model(0, shape, classes),
        StepSpec(learning_rate=0.01, precision=PrecisionChoice(FLOAT32, False, "test"),
                 global_batch_size=GLOBAL_BATCH, jit_compile=False))
    steps, per_epoch = trainer.steps, feed.steps_per_epoch
    checkpoints = Checkpoints(trainer, tmp_path / "ckpt")
    # Epoch 1: the optimizer's moments are under way.
    trainer.loops.runner(feed.source(Position(0)))(per_epoch)
    # Epoch 2, one step a call, a checkpoint (a folder of its own) after a dozen or more of
    # its steps (44 steps of digits: every 3rd; 18 of the files: each).
    stops = list(range(1, per_epoch, max(per_epoch // 12, 1)))
    steps.reset_train_metrics()
    run = trainer.loops.runner(feed.source(Position(1)))
    for done in range(1, per_epoch + 1):
        run(1)
        if done in stops:
            checkpoints.directory = tmp_path / f"ckpt-{done}"
            checkpoints.save(Position(1, done))
    expected, expected_state = _metrics(trainer), _state(trainer)

    differences = []
    for stop in stops:
        steps.reset_train_metrics()
        checkpoints.directory = tmp_path / f"ckpt-{stop}"
        assert checkpoints.restore() == Position(1, stop)
        checkpoints.restore_metrics()
        trainer.loops.runner(feed.source(Position(1, stop)))(per_epoch - stop)
        found = _metrics(trainer)
        if found != expected or _state(trainer) != expected_state:
            differences.append((stop, abs(found[0] - expected[0]), abs(found[1] - expected[1]),
                                _state(trainer) == expected_state))
    assert len(stops) >= 10
    assert not differences, (
        f"{len(differences)} of {len(stops)} stops differ (step, |d loss|, |d accuracy|, "
        f"weights equal): {differences}")


@pytest.mark.slow
def test_a_checkpoint_of_another_replica_count_or_of_sums_alone_resumes_its_sums(
    logical_cpus: tuple[str, ...], tmp_path: Path
) -> None:
    import tensorflow as tf

    from mgpu_env.hardware.devices import DeviceSplit
    from mgpu_env.runtime.precision import FLOAT32, PrecisionChoice
    from mgpu_env.runtime.strategy import make_strategy, plan_strategy
    from mgpu_env.training.run.checkpoints import Checkpoints
    from mgpu_env.training.shared.position import Position
    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.model import build_model
    from mgpu_env.training.step.steps import StepSpec

    def started(replicas: int) -> tuple[Any, Any, Checkpoints]:
        strategy = make_strategy(plan_strategy("auto", DeviceSplit("CPU", 1, replicas)))
        feed, shape, classes = _feed(strategy, "resident", tmp_path)
        trainer = build_trainer(strategy, lambda: build_model(0, shape, classes),
            StepSpec(learning_rate=0.01, precision=PrecisionChoice(FLOAT32, False, "test"),
                     global_batch_size=GLOBAL_BATCH, jit_compile=False))
        return trainer, feed, Checkpoints(trainer, tmp_path / f"ckpt-{replicas}")

    saved, feed, checkpoints = started(2)
    saved.loops.runner(feed.source(Position(0)))(7)
    checkpoints.save(Position(0, 7))
    # The form an mgpu before per-replica metrics wrote: their sums alone.
    tf.train.Checkpoint(model=saved.model, optimizer=saved.optimizer, epoch=checkpoints.epoch,
                        step=checkpoints.step, metrics=checkpoints.metrics_copy,
                        random=checkpoints._random()).save(str(tmp_path / "sums" / "ckpt-0-7"))
    (tmp_path / "sums" / "checkpoint").write_text('model_checkpoint_path: "ckpt-0-7-1"\n')
    for source in ("ckpt-2", "sums"):
        restored, _, into = started(4)
        into.directory = tmp_path / source
        assert into.restore() == Position(0, 7) and not into.per_replica_restored
        into.restore_metrics()
        # Spread over 4 replicas, the sums read back as they were saved.
        assert _metrics(restored) == _metrics(saved)
        assert _state(restored) == _state(saved)
