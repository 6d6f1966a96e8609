"""A run's checkpoints: where each is, saving, restoring, when the next is due, its cost.

That is: where in the run each is, how one is saved and restored, when the next is due, and
what one costs.

A checkpoint holds the model, the optimizer (with the loss scale under float16), the epochs
completed and the steps done in the next one, that epoch's running metrics as each replica
holds them (so the rest of the epoch adds to the same sums, to the bit), and the
model's random state (Keras' seed generators: Dropout's draws, which the model's own
checkpoint leaves out). The data's position needs nothing more: every feed's order is drawn
from (SEED, epoch), so the checkpoint's `Position` is where each feed resumes
(`Feed.runner`'s `start`): the kept rows' gather index, the streamed chunks cut from that step, the
loader's rows and the files' records skipped to it.

Names: `Position.name` (`ckpt-<E>` at the end of epoch E, `ckpt-<E>-<S>` after S steps of
epoch E + 1; `Position.parse` reads them back). tf.train.CheckpointManager writes the data
files first and the `checkpoint` index file last, by rename, so a kill -9 mid-save leaves the
previous checkpoint the one referenced; the index lists the kept ones (`CHECKPOINTS_KEPT`,
oldest deleted first), so a manager made for each save (`Position.manager_name`) takes over
the list as it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env.config.parsers import CheckpointInterval
from mgpu_env.training.input.order import STEPS_PER_CALL
from mgpu_env.training.shared.position import Position

CHECKPOINTS_KEPT = 3


@dataclass(frozen=True)
class SaveCost:
    """What one checkpoint took: seconds to write, and bytes on disk."""

    seconds: float
    bytes: int

    @property
    def mb(self) -> float:
        return self.bytes / 1e6


class Checkpoints:
    """The run's checkpoint: what it holds, where it is written, and what saving cost."""

    def __init__(self, trainer: Any, directory: Path) -> None:
        import tensorflow as tf

        steps = trainer.steps
        with trainer.strategy.scope():
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.directory = directory
        self.model, self.optimizer = trainer.model, trainer.optimizer
        # The epoch's running loss and accuracy, so a resumed epoch's record is the
        # uninterrupted one's, to the bit: each replica's own metric state (`replica_metrics`,
        # row r: replica r's), since each adds its losses to its own running sums and the
        # result sums the replicas; their sum alone (`metrics`) is kept for a resume on
        # another replica count. Saved through plain copies, outside the strategy:
        # restoring the metrics' own (mirrored, summed) variables runs a collective on the
        # chief alone under MultiWorkerMirroredStrategy, which the other workers never join.
        self.metrics = [*steps.train_loss.variables, *steps.train_accuracy.variables]
        self.metrics_copy = tf.Variable(tf.zeros([len(self.metrics)], tf.float64),
                                        trainable=False, name="metrics")
        self.replica_metrics = tf.Variable(
            tf.zeros([trainer.strategy.num_replicas_in_sync, len(self.metrics)], tf.float64),
            trainable=False, name="replica_metrics")
        self.per_replica_restored = True  # False: the sums were spread (`restore`)
        self.checkpoint = tf.train.Checkpoint(
            model=trainer.model, optimizer=trainer.optimizer, epoch=self.epoch, step=self.step,
            metrics=self.metrics_copy, replica_metrics=self.replica_metrics,
            # The model's state that is not a weight: its seed generators' states.
            random=self._random(),
        )
        self._gather = replica_metrics_gather(trainer.strategy, self.metrics)
        self._scatter = replica_metrics_scatter(trainer.strategy, self.metrics,
                                                self.replica_metrics)
        self.costs: list[SaveCost] = []

    def _random(self) -> list[Any]:
        weights = {id(v) for v in self.model.weights}
        return [v for v in self.model.variables if id(v) not in weights]

    def shared_variables(self) -> list[Any]:
        """Every value a checkpoint holds: what a multi-worker chief shares with the others
        after restoring (they need no shared folder)."""
        return [*self.model.variables, *self.optimizer.variables, self.metrics_copy,
                self.replica_metrics, self.epoch, self.step]

    def estimated_bytes(self) -> int:
        """The checkpoint's size from its values (the files add little): to tell the cost
        before the first save."""
        total = 0
        for v in [*self.model.variables, *self.optimizer.variables, self.metrics_copy,
                  self.replica_metrics]:
            count = 1
            for dim in v.shape:
                count *= int(dim)
            total += count * _dtype_size(v.dtype)
        return total

    def manager(self, position: Position) -> Any:
        """A CheckpointManager whose next save is `position`'s name."""
        import tensorflow as tf

        return tf.train.CheckpointManager(
            self.checkpoint, str(self.directory), max_to_keep=CHECKPOINTS_KEPT,
            checkpoint_name=position.manager_name[0],
        )

    def save(self, position: Position) -> SaveCost:
        """Save the run at `position`; return (and keep) what it cost."""
        import tensorflow as tf

        started = time.perf_counter()
        self.epoch.assign(position.epoch)
        self.step.assign(position.step)
        # Collective under multi-worker: every worker saves, at the same step.
        self.replica_metrics.assign(self._gather())
        self.metrics_copy.assign(tf.reduce_sum(self.replica_metrics, axis=0))
        path = self.manager(position).save(checkpoint_number=position.manager_name[1])
        cost = SaveCost(time.perf_counter() - started, _size(Path(path)))
        self.costs.append(cost)
        return cost

    @property
    def latest(self) -> str | None:
        return self.manager(Position(0)).latest_checkpoint

    def restore(self) -> Position:
        """Restore the latest checkpoint (the caller names one that cannot be): its
        position, or the start when there is none."""
        import tensorflow as tf

        latest = self.latest
        if latest is None:
            return Position(0)
        held = tf.train.load_checkpoint(latest).get_variable_to_shape_map()
        replicas = held.get("replica_metrics/.ATTRIBUTES/VARIABLE_VALUE")
        self.per_replica_restored = replicas == self.replica_metrics.shape.as_list()
        checkpoint = self.checkpoint
        if not self.per_replica_restored:
            # Saved on another replica count, or by an mgpu that kept the sums alone: the
            # sums are spread over the replicas (the epoch's record may then differ from
            # an uninterrupted run's in its last bits; the weights do not).
            checkpoint = tf.train.Checkpoint(
                model=self.model, optimizer=self.optimizer, epoch=self.epoch, step=self.step,
                metrics=self.metrics_copy, random=self._random())
        try:
            checkpoint.restore(latest).assert_existing_objects_matched()
        except AssertionError:
            # A checkpoint of an mgpu before checkpoints inside the epoch: the model, the
            # optimizer and the epoch alone, at the epoch's end.
            tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, epoch=self.epoch
                                ).restore(latest).assert_existing_objects_matched()
            self.step.assign(0)
        if not self.per_replica_restored:
            replicas = self.replica_metrics.shape[0]
            self.replica_metrics.assign(tf.tile(self.metrics_copy[None, :] / replicas,
                                                [replicas, 1]))
        return self.position()

    def restore_metrics(self) -> None:
        """Each replica's running metrics from its row of the restored copy; on every worker
        at once, after the chief's values were shared (the assignment is collective)."""
        self._scatter()

    def position(self) -> Position:
        """The position the checkpoint's variables hold (after a restore, or a chief's)."""
        return Position(int(self.epoch.numpy()), int(self.step.numpy()))

    def describe_cost(self) -> dict[str, Any]:
        """metrics.json's `checkpoint` costs: saves, mean and last seconds, size in MB."""
        if not self.costs:
            return {"saves": 0}
        seconds = [c.seconds for c in self.costs]
        return {"saves": len(self.costs), "mean_seconds": sum(seconds) / len(seconds),
                "max_seconds": max(seconds), "mb": self.costs[-1].mb}


def replica_metrics_gather(strategy: Any, metrics: list[Any]) -> Any:
    """() -> [replicas, metrics] float64: each replica's own values of `metrics` (row r:
    replica r's in the sync group, every worker's replicas included). One all-reduce: each
    replica contributes its row and zeros elsewhere, and x + 0 is x, so the rows are exact."""
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync

    @tf.function
    def gather() -> Any:
        def replica_fn() -> Any:
            context = tf.distribute.get_replica_context()
            # Read in the replica's context: a metric's variable is its own replica's part.
            row = tf.stack([tf.cast(tf.convert_to_tensor(v), tf.float64) for v in metrics])
            mine = tf.one_hot(context.replica_id_in_sync_group, replicas, dtype=tf.float64)
            return context.all_reduce(tf.distribute.ReduceOp.SUM, mine[:, None] * row[None, :])

        return strategy.experimental_local_results(strategy.run(replica_fn))[0]

    return gather


def replica_metrics_scatter(strategy: Any, metrics: list[Any], rows: Any) -> Any:
    """() -> None: each replica's `metrics` set to its own row of `rows` (as saved by
    `replica_metrics_gather`); assigned in the replica's context, so each part is its own."""
    import tensorflow as tf

    @tf.function
    def scatter() -> None:
        def replica_fn() -> None:
            row = tf.gather(rows, tf.distribute.get_replica_context().replica_id_in_sync_group)
            for index, variable in enumerate(metrics):
                variable.assign(tf.cast(row[index], variable.dtype))

        strategy.run(replica_fn)

    return scatter


def _dtype_size(dtype: Any) -> int:
    """Bytes per element of a TensorFlow or Keras dtype (a name or an object)."""
    import numpy as np

    name = getattr(dtype, "name", dtype)
    try:
        return int(np.dtype(str(name)).itemsize)
    except TypeError:
        return 2 if "16" in str(name) else 4  # bfloat16 has no NumPy dtype


def checkpoint_plan_line(interval: CheckpointInterval, checkpoints: Checkpoints) -> str:
    """The start's line on checkpoints: when, and the size of one (estimated from its
    values; its seconds are told after the first save, and kept in metrics.json)."""
    size = checkpoints.estimated_bytes() / 1e6
    return (f"Checkpoints: {interval.describe()}, about {size:.1f} MB each (model, "
            f"optimizer, position in the data), in {checkpoints.directory}")


def _size(prefix: Path) -> int:
    """The bytes of a checkpoint's files (`<prefix>.index`, `<prefix>.data-*`)."""
    return sum(p.stat().st_size for p in prefix.parent.glob(prefix.name + ".*") if p.is_file())


# ------------------------------------------------------------------------------ schedule


@dataclass
class Schedule:
    """When a checkpoint inside an epoch is due (`CHECKPOINT_EVERY`), and where the calls
    of the steps end so it lands there.

    Calls end every STEPS_PER_CALL steps of an epoch, at its end, and (N steps asked) at
    every step of the run that is a multiple of N: the save lands exactly at the step
    asked. A time is checked at each call's end: the save lands at the first call boundary
    after it (at most STEPS_PER_CALL steps late). The calls are a function of the position
    alone, so a resumed run cuts its calls where the uninterrupted one did.
    """

    interval: CheckpointInterval
    steps_per_epoch: int
    last_save: float = 0.0  # time.monotonic() of the last save (or of training's start)

    def call_steps(self, at: Position) -> int:
        """The steps of the next call from `at` (its epoch's steps done so far)."""
        done = at.step
        count = min(STEPS_PER_CALL - done % STEPS_PER_CALL, self.steps_per_epoch - done)
        every = self.interval.steps
        if every:
            count = min(count, every - self._run_step(at) % every)
        return count

    def due(self, at: Position) -> bool:
        """A checkpoint is due at `at` (never at an epoch's end: the epoch's own checkpoint
        is saved there)."""
        if at.step >= self.steps_per_epoch:
            return False
        if self.interval.steps:
            return self._run_step(at) % self.interval.steps == 0
        if self.interval.seconds:
            return time.monotonic() - self.last_save >= self.interval.seconds
        return False

    def saved(self) -> None:
        self.last_save = time.monotonic()

    def _run_step(self, at: Position) -> int:
        """Steps of the run before `at`."""
        return at.epoch * self.steps_per_epoch + at.step
