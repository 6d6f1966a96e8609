"""`resident`: the training rows kept once on each local replica's device.

They are read in the run's order by index (`step.loops.KeptRows`): the feed of every data set
that fits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mgpu_env.training.input.data.sets import Arrays, FileData, Streamed, as_float32, release_pages
from mgpu_env.training.input.feeds.kind import (
    Feed,
    FeedKind,
    FeedMaking,
    FeedNeed,
    FeedPlan,
    whole_batches,
)
from mgpu_env.training.input.order import call_steps, each_device, epoch_order
from mgpu_env.training.shared.position import Position
from mgpu_env.training.step.loops import KeptRows

# The most bytes of rows one call gathers on each device for its steps (the only memory a
# resident feed adds beyond the rows): 64 MiB is 320 of the MLP's 64-row batches, more than
# a training call's 200 steps; rows of large images get fewer per call.
CALL_ROWS_BYTES = 64 * 1024**2


@dataclass
class ResidentFeed:
    """The training rows, once on each local replica's device; the trainer's loop gathers
    each call's batches by index (`step.loops.gather_loop`)."""

    strategy: Any
    rows: Any  # (x, y), each a PerReplica of the whole training set on that replica's device
    size: int
    global_batch: int
    seed: int
    row_bytes: int  # one training row, x and y
    # The plan's count (`registry.plan_feed`), passed down: a feed never counts its own.
    steps_per_epoch: int = field(kw_only=True)

    @classmethod
    def place(cls, strategy: Any, arrays: Arrays, global_batch: int, seed: int, *,
              steps_per_epoch: int) -> ResidentFeed:
        """Copy the training rows onto every local replica's device (one copy each)."""
        # Memory-mapped or uint8 samples (an npy folder) become float32 here, once; the
        # file's pages, all read, need not stay in this process's memory.
        x_train = as_float32(arrays.x_train)
        release_pages(arrays.x_train)
        rows = _on_each_device(strategy, lambda: (x_train, arrays.y_train))
        row_bytes = (x_train.nbytes + arrays.y_train.nbytes) // max(arrays.train_size, 1)
        return cls(strategy, rows, arrays.train_size, global_batch, seed, row_bytes,
                   steps_per_epoch=steps_per_epoch)

    @property
    def steps_per_call(self) -> int:
        """The most steps one compiled call runs: their rows, gathered at its start, stay
        within CALL_ROWS_BYTES on each device."""
        return call_steps(self.strategy, self.global_batch, self.row_bytes, CALL_ROWS_BYTES)

    def order(self, first_epoch: int, epochs: int = 1) -> Any:
        """The orders of `epochs` epochs from `first_epoch`, one after the other, on every
        device: step s of the run they cover reads rows order[s*G : (s+1)*G]."""
        host = np.concatenate([
            epoch_order(self.seed, epoch, self.size, self.global_batch)
            for epoch in range(first_epoch, first_epoch + epochs)
        ])
        return _on_each_device(self.strategy, lambda: host)

    def describe(self) -> str:
        return f"rows kept on {each_device(self.strategy)}, gathered by index"

    def source(self, start: Position, epochs: int = 1) -> KeptRows:
        """The rows and the order of `epochs` epochs from `start` (a checkpoint's position:
        its step of the epoch after its epochs)."""
        return KeptRows(self.rows, self.order(start.epoch, epochs), self.global_batch,
                        start.step, self.steps_per_call)


def _on_each_device(strategy: Any, host_values: Callable[[], Any]) -> Any:
    """`host_values()` (numpy arrays) as tensors on each local replica's device."""
    import tensorflow as tf

    devices = strategy.extended.worker_devices

    def value_fn(context: Any) -> Any:
        # The strategy does not place these values: each goes to its replica's device here.
        # Under MultiWorkerMirroredStrategy the id counts every worker's replicas.
        with tf.device(devices[context.replica_id_in_sync_group % len(devices)]):
            return tf.nest.map_structure(tf.identity, host_values())

    return strategy.experimental_distribute_values_from_function(value_fn)


def _claims(need: FeedNeed) -> FeedPlan | None:
    """Rows within the keep limit; files among them are read whole first."""
    if isinstance(need.data, Streamed) or not need.fits:
        return None
    read = ": read whole from the files" if isinstance(need.data, FileData) else ""
    return FeedPlan("resident", whole_batches(need),
                    f"{need.what()} fit {need.limit()}{read}")


def _build(made: FeedMaking) -> Feed:
    data = made.data
    if isinstance(data, FileData):
        from mgpu_env.training.input.data.read import read_whole

        data = read_whole(data)
    assert isinstance(data, Arrays)
    return ResidentFeed.place(made.strategy, data, made.global_batch, made.seed,
                              steps_per_epoch=made.plan.steps_per_epoch)


KIND = FeedKind("resident", 20, _claims, _build, "kept on each device")
