"""`file_stream`: files whose decoded rows do not fit, streamed from the files every epoch.

The files are TFRecord files or an image folder; each worker reads its share
(`step.loops.Batches`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mgpu_env.training.input.data.read import steps_per_epoch
from mgpu_env.training.input.data.sets import FileData
from mgpu_env.training.input.feeds.kind import Feed, FeedKind, FeedMaking, FeedNeed, FeedPlan
from mgpu_env.training.input.feeds.tfdata import distribute, stream_options
from mgpu_env.training.input.order import each_device
from mgpu_env.training.shared.messages import FILE_KIND_NOUNS
from mgpu_env.training.shared.position import Position
from mgpu_env.training.step.loops import Batches


@dataclass
class FileStreamFeed:
    """TFRecord files or an image folder too big to keep on the devices, streamed from the
    files every epoch: each worker reads its share (`data.read.worker_rows`: by file when
    there are enough files, else by record), batches it per replica and keeps whole steps."""

    strategy: Any
    data: FileData
    global_batch: int
    seed: int
    deterministic: bool = True
    # The plan's: the whole global batches every worker's share of the files gives.
    steps_per_epoch: int = field(kw_only=True)

    def describe(self) -> str:
        return (f"{FILE_KIND_NOUNS[self.data.kind]} in {self.data.folder}, streamed to "
                f"{each_device(self.strategy)} by tf.data, each worker its share")

    def worker_dataset(self, context: Any, start: Position, epochs: int = 1) -> Any:
        """The per-replica batches of the worker `context` (a tf.distribute.InputContext)
        names, for `epochs` epochs from `start`: every worker the
        same whole steps."""
        import tensorflow as tf

        from mgpu_env.training.input.data.read import worker_rows

        replicas = self.strategy.num_replicas_in_sync
        workers, worker = context.num_input_pipelines, context.input_pipeline_id
        steps = self.steps_per_epoch
        per_epoch = [
            worker_rows(self.data, self.seed, epoch, workers, worker)
            .batch(self.global_batch // replicas, drop_remainder=True)
            .take(steps * (replicas // workers))
            for epoch in range(start.epoch, start.epoch + epochs)
        ]
        data = per_epoch[0]
        for more in per_epoch[1:]:
            data = data.concatenate(more)
        # The data's position: the files' records before `start.step` are read, not trained.
        data = data.skip(start.step * (replicas // workers))
        return data.prefetch(tf.data.AUTOTUNE).with_options(stream_options(self.deterministic))

    def dataset(self, start: Position, epochs: int = 1) -> Any:
        """`epochs` epochs from `start`, one after the other,
        distributed."""
        return distribute(self.strategy, lambda context: self.worker_dataset(
            context, start, epochs))

    def source(self, start: Position, epochs: int = 1) -> Batches:
        """The batches of `epochs` epochs from `start` (a checkpoint's position)."""
        return Batches(self.dataset(start, epochs))


def _claims(need: FeedNeed) -> FeedPlan | None:
    """Files over the keep limit; steps per epoch: the whole global batches every worker's
    share of the files gives."""
    if not isinstance(need.data, FileData) or need.fits:
        return None
    return FeedPlan("file_stream", steps_per_epoch(need.data.train, need.global_batch,
                                                   need.workers),
                    f"{need.what()} are over {need.limit()}: each worker streams its share "
                    "of the files")


def _build(made: FeedMaking) -> Feed:
    assert isinstance(made.data, FileData)
    return FileStreamFeed(made.strategy, made.data, made.global_batch, made.seed,
                          made.deterministic, steps_per_epoch=made.plan.steps_per_epoch)


KIND = FeedKind("file_stream", 30, _claims, _build, "streamed from the files by tf.data")
