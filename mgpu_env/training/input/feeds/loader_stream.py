"""`row_stream`: a `DATASET` loader's tf.data set streamed from its pipeline every epoch.

It is the feed of a loader's set too big to read into memory (`data.Streamed`), read as
batches (`step.loops.Batches`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mgpu_env.training.input.data.sets import Streamed
from mgpu_env.training.input.feeds.kind import (
    Feed,
    FeedKind,
    FeedMaking,
    FeedNeed,
    FeedPlan,
    whole_batches,
)
from mgpu_env.training.input.feeds.tfdata import distribute, stream_options
from mgpu_env.training.input.order import each_device
from mgpu_env.training.shared.position import Position
from mgpu_env.training.step.loops import Batches

# Rows a loader's stream shuffles among (tf.data's shuffle buffer): a stream too big for
# memory cannot be permuted whole.
STREAM_SHUFFLE_BUFFER = 10_000


@dataclass
class RowStreamFeed:
    """A DATASET loader's rows too big to read into memory (`data.Streamed`), streamed from
    its pipeline every epoch to every replica.

    Each worker's pipeline shuffles the rows in a buffer (seeded by SEED + epoch), batches
    them per replica and keeps only its own replicas' batches, so global batch b is the
    same rows on every replica and worker count. Costlier per step than `StreamFeed`, which
    cuts whole batches from arrays: here every row passes through the shuffle buffer.
    """

    strategy: Any
    rows: Any  # tf.data.Dataset of (x, y) rows
    size: int
    global_batch: int
    seed: int
    deterministic: bool = True
    steps_per_epoch: int = field(kw_only=True)  # the plan's (`registry.plan_feed`)

    def describe(self) -> str:
        return (f"a loader's rows, streamed from its pipeline to {each_device(self.strategy)} "
                f"by tf.data, shuffled among {STREAM_SHUFFLE_BUFFER:,}")

    def dataset(self, start: Position, epochs: int = 1) -> Any:
        """`epochs` epochs from `start`, one after the other,
        distributed."""
        import tensorflow as tf

        replicas = self.strategy.num_replicas_in_sync
        per_replica = self.global_batch // replicas

        def per_worker(context: Any) -> Any:
            workers, worker = context.num_input_pipelines, context.input_pipeline_id
            local = replicas // workers

            def one_epoch(epoch: Any) -> Any:
                # The seed as a tensor gives the order a Python int seed + epoch gives.
                data = self.rows.shuffle(
                    STREAM_SHUFFLE_BUFFER, seed=self.seed + epoch, reshuffle_each_iteration=False
                )
                data = data.batch(per_replica, drop_remainder=True)
                data = data.take(self.steps_per_epoch * replicas)  # whole global batches
                if workers > 1:
                    # Per-replica batch k belongs to replica k % R: this worker keeps its own.
                    data = data.enumerate().filter(
                        lambda k, _: (k % replicas) // local == worker
                    ).map(lambda _, batch: batch)
                return data

            epochs_data = tf.data.Dataset.range(start.epoch, start.epoch + epochs)
            # The data's position: the steps before `start.step` pass through the shuffle
            # buffer untrained, so the ones after are the order's (when it is deterministic).
            data = epochs_data.flat_map(one_epoch).skip(start.step * local)
            return data.prefetch(tf.data.AUTOTUNE).with_options(
                stream_options(self.deterministic)
            )

        return distribute(self.strategy, per_worker)

    def source(self, start: Position, epochs: int = 1) -> Batches:
        """The batches of `epochs` epochs from `start` (a checkpoint's position)."""
        return Batches(self.dataset(start, epochs))


def _claims(need: FeedNeed) -> FeedPlan | None:
    """A loader's stream always streams: it cannot be read whole."""
    if not isinstance(need.data, Streamed):
        return None
    return FeedPlan("row_stream", whole_batches(need),
                    f"your loader's {need.rows:,} rows are a tf.data set too big to read: "
                    "they stream from its pipeline")


def _build(made: FeedMaking) -> Feed:
    assert isinstance(made.data, Streamed)
    return RowStreamFeed(made.strategy, made.data.train.rows, made.data.train.size,
                         made.global_batch, made.seed, made.deterministic,
                         steps_per_epoch=made.plan.steps_per_epoch)


KIND = FeedKind("row_stream", 10, _claims, _build, "streamed from its pipeline by tf.data")
