"""What a streamed feed delivers on its own: its distributed dataset iterated, no step run.

Against what the step takes (the synthetic point's samples/s), it says whether the input
keeps up with the replica counts measured, or from which one it limits them. Any feed's
source is measured by its form (`training.step.loops`), whatever its kind: rows kept on
the devices (`KeptRows`) have no pipeline per step, so there is nothing to measure alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

KEPT_REASON = "kept on each device: no pipeline to time"
# Elements timed at the least: a stream holds a few ready (prefetched on the host and on
# each device) when the clock starts, and their head start must be a small part of it.
MIN_TIMED_ELEMENTS = 32


def element_samples(per_replica: Iterable[Any], chunked: bool) -> int:
    """Samples in one element of a distributed dataset, over its local replicas' parts.

    Each part is (x, y): one per-replica batch, (batch, ...), or a chunk
    (`step.loops.Chunks`) of several steps' batches, (steps, batch, ...), whose last one is
    shorter. Counted from the shapes the element has, never from how many elements were
    taken.
    """
    total = 0
    for x, _ in per_replica:
        shape = x.shape
        total += int(shape[0]) * int(shape[1]) if chunked else int(shape[0])
    return total


@dataclass(frozen=True)
class SampleBudget:
    """How many samples a feed is taken for: `warmup` untimed, then at least `timed`."""

    warmup: int
    timed: int


def time_elements(
    elements: Iterable[Any],
    samples_of: Callable[[Any], int],
    budget: SampleBudget,
    settle: Callable[[Any], Any],
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Take elements until `budget.warmup` samples (at least one element) untimed, then time
    them until `budget.timed` more and MIN_TIMED_ELEMENTS, or the end of `elements`.

    `settle(element)` waits until an element is really there (fetches a little of it to the
    host). Stops at the end of `elements` without asking for more: a stream of chunks has
    fewer elements than batches.
    """
    iterator = iter(elements)
    warm = 0
    for element in iterator:
        warm += samples_of(element)
        if warm >= budget.warmup:
            settle(element)
            break
    samples = count = 0
    start = clock()
    last = None
    for element in iterator:
        last = element
        samples += samples_of(element)
        count += 1
        if samples >= budget.timed and count >= MIN_TIMED_ELEMENTS:
            break
    if last is not None:
        settle(last)
    seconds = clock() - start
    if count == 0:
        return {"samples_per_s": None, "samples": 0, "elements": 0, "seconds": 0.0,
                "skipped": "too short to time: the stream ended in its warm-up"}
    return {"samples_per_s": samples / seconds, "samples": samples, "elements": count,
            "seconds": seconds}


def measure_input_alone(feed: Any, strategy: Any, budget: SampleBudget) -> dict[str, Any]:
    """Samples/s the feed's distributed dataset gives with no step run: every element
    fetched to the devices (InputOptions.experimental_fetch_to_device), none trained on.

    The dataset covers as many epochs as the warm-up and the timing take, plus one; the
    count of samples comes from the elements' shapes."""
    from mgpu_env.training.shared.position import Position
    from mgpu_env.training.step.loops import Batches, Chunks, KeptRows

    first = feed.source(Position(0))
    if isinstance(first, KeptRows):
        return {"samples_per_s": None, "skipped": KEPT_REASON}
    chunked = isinstance(first, Chunks)
    # An element is one global batch, or one chunk of steps' batches for each replica.
    element = feed.global_batch * (first.lengths[0] if isinstance(first, Chunks) else 1)
    wanted = budget.warmup + max(budget.timed, MIN_TIMED_ELEMENTS * element)
    epochs = -(-wanted // max(feed.steps_per_epoch * feed.global_batch, 1)) + 1
    source = feed.source(Position(0), epochs)
    assert isinstance(source, Chunks | Batches)
    elements = source.dataset if isinstance(source, Chunks) else source.elements
    return time_dataset(elements, strategy, chunked, budget)


def time_dataset(
    dataset: Any, strategy: Any, chunked: bool, budget: SampleBudget
) -> dict[str, Any]:
    """`time_elements` over a distributed dataset of (x, y) elements: per-replica batches,
    or chunks of them (`chunked`)."""

    def samples_of(element: Any) -> int:
        return element_samples(zip(*_local(strategy, element), strict=True), chunked)

    def settle(element: Any) -> None:
        # A label of each replica's part read back: its copy to the device is done.
        for y in _local(strategy, element)[1]:
            y[:1].numpy()

    return time_elements(dataset, samples_of, budget, settle)


def _local(strategy: Any, element: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(x parts, y parts) of an element, one per local replica."""
    x, y = element
    return strategy.experimental_local_results(x), strategy.experimental_local_results(y)
