"""Which rows each step takes, shared by the kept rows and the streams (`feeds`).

One permutation per epoch, drawn from (SEED, epoch) on the host, cut to whole global batches;
replica r of R takes rows [b*G + r*G/R, b*G + (r+1)*G/R) of the epoch's order for global
batch b, so a run's batches are the same whatever the replica count or the feed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The most steps training asks a runner for at once (`run.trainer`): Python runs once per call,
# and a stop request (a signal, a non-finite loss) is acted on at the next call's end.
STEPS_PER_CALL = 200


def epoch_order(seed: int, epoch: int, size: int, global_batch: int) -> np.ndarray:
    """The rows of one epoch, in training order: a permutation drawn from (seed, epoch), cut
    to whole global batches. The same on every replica count and worker, and on resume."""
    steps = size // global_batch
    order = np.random.default_rng([seed, epoch]).permutation(size)[: steps * global_batch]
    # int64: TensorFlow keeps int32 tensors of a GPU in host memory, so int64 indices stay
    # on the device with the rows they index.
    return order.astype(np.int64)


def call_steps(strategy: Any, global_batch: int, row_bytes: int, budget: int) -> int:
    """The most steps whose rows (`row_bytes` each) stay within `budget` bytes on each
    replica's device: a `ResidentFeed` call's, or a `StreamFeed` chunk's."""
    per_replica = global_batch // strategy.num_replicas_in_sync
    return max(1, budget // max(per_replica * row_bytes, 1))


def each_device(strategy: Any) -> str:
    """This worker's replicas' devices, in words: "the device", "each of 2 devices"."""
    local = len(strategy.extended.worker_devices)
    return "the device" if local == 1 else f"each of {local} devices"
