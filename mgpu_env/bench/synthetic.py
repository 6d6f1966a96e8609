"""`mgpu bench`'s synthetic data: one batch already on each device, reused every step.

A feed of the training module's shape (`training.input.feeds.Feed`), so a synthetic point
runs the replica step in the same compiled loop as a training run's streamed feeds (the
trainer's loop over `training.step.loops.Batches`), with no input at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mgpu_env.runtime.decisions import global_batch_size
from mgpu_env.training.input.order import each_device
from mgpu_env.training.shared.position import Position
from mgpu_env.training.step.loops import Batches


class SameBatch:
    """An "iterator" that yields one batch already on the devices, step after step.

    The training loop calls `next()` on what it is given while tracing, so the per-replica
    tensors become inputs of the traced loop: no host-to-device copy and no input pipeline.
    """

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __iter__(self) -> SameBatch:
        return self

    def __next__(self) -> Any:
        return self.batch


@dataclass
class SameBatchFeed:
    """One random batch per replica, made on its device and fed to every step."""

    strategy: Any
    batches: SameBatch
    global_batch: int

    @classmethod
    def make(cls, strategy: Any, per_replica_batch: int, input_shape: tuple[int, ...],
             classes: int, seed: int) -> SameBatchFeed:
        """Uniform samples of `input_shape` and labels below `classes`, drawn on each
        replica's device from seed + its replica id."""
        import tensorflow as tf

        def make(context: Any) -> tuple[Any, Any]:
            generator = tf.random.Generator.from_seed(seed + context.replica_id_in_sync_group)
            x = generator.uniform((per_replica_batch, *input_shape))
            y = generator.uniform((per_replica_batch,), maxval=classes, dtype=tf.int32)
            return x, y

        batch = strategy.experimental_distribute_values_from_function(make)
        return cls(strategy, SameBatch(batch),
                   global_batch_size(per_replica_batch, strategy.num_replicas_in_sync))

    @property
    def steps_per_epoch(self) -> int:
        """One batch is the whole data set: each step is an epoch of its own."""
        return 1

    def describe(self) -> str:
        return f"one synthetic batch on {each_device(self.strategy)}, reused every step"

    def source(self, start: Position, epochs: int = 1) -> Batches:
        """The same batch for every step, however many: every epoch (and every position in
        one) is that batch (the same object every call: a new one would trace again)."""
        return Batches(self.batches)
