"""Interleaved timing: the data variants of one sweep point take turns in one process.

Points measured one after the other, each in a process of its own, meet different loads on
a machine shared with other work: the same kept data once lost 9.4%, 26.8% and 29% of
synthetic throughput in three runs minutes apart. Taking turns interval by interval in one
process (as `benchmarks/input_cost.py` does) gives each variant the same load, so the ratio
of two intervals of one round is steady even when the machine is not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timings:
    """One variant's timed intervals, in round order: how long each took, when each
    started (seconds from the first timed interval of the process), and the CPU time this
    process (all its threads) spent in each."""

    seconds: list[float] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)


def round_orders(variants: int, rounds: int) -> list[list[int]]:
    """The order the variants take in each round: a Williams design, so that over its
    cycle each variant follows every other equally often (with 2 variants, they swap
    every round; with 3, six orders). Whatever a variant leaves running after its interval
    (a stream's prefetching threads) then lands on each of the others alike, not always on
    the same one."""
    if variants < 1 or rounds < 0:
        raise ValueError(f"need 1 or more variants and 0 or more rounds, got {variants}, "
                         f"{rounds}")
    # The first row 0, 1, k-1, 2, k-2, ...; the others shifted by 1 each (mod k). For an odd
    # count the mirrored rows complete the balance.
    first, low, high = [0], 1, variants - 1
    while len(first) < variants:
        first.append(low)
        low += 1
        if len(first) < variants:
            first.append(high)
            high -= 1
    cycle = [[(v + shift) % variants for v in first] for shift in range(variants)]
    if variants % 2 and variants > 1:
        cycle += [row[::-1] for row in cycle]
    return [cycle[r % len(cycle)] for r in range(rounds)]


def warmup_intervals(warmup_steps: int, steps_per_interval: int) -> int:
    """The warm-up in whole intervals (at least `warmup_steps`): a stream's chunks divide
    the intervals (a stream's `steps_per_call`), so every timed interval then starts at a
    chunk's start and takes whole chunks in one call, as training's calls do."""
    return -(-warmup_steps // steps_per_interval)


def lead_in_steps(variants: int, steps_per_interval: int) -> int:
    """Untimed steps a variant runs right before each of its timed intervals: one interval's
    worth where variants take turns, none for a variant alone.

    Training runs one feed without a break; taking turns breaks it at every interval, and
    a stream's pipeline, which cut chunks ahead during the others' intervals, starts each of
    its own intervals out of step (2 logical CPU devices, digits, the MLP, 20 rounds of 100
    steps, `benchmarks/input_cost.py --stream --lead-in 0|100`: the stream lost 10.2% and
    14.5% of synthetic without a lead-in, 7.3% and 6.7% with one). After a lead-in of its
    own a timed interval starts as training's calls do, mid-run."""
    return steps_per_interval if variants > 1 else 0


@dataclass(frozen=True)
class Schedule:
    """A point's timing: `warmup_steps` untimed, then `intervals` timed intervals of
    `steps_per_interval` steps each."""

    warmup_steps: int
    steps_per_interval: int
    intervals: int


def time_interleaved(
    runs: Sequence[Callable[[int], Any]],
    schedule: Schedule,
    clock: Callable[[], float] = time.perf_counter,
    cpu_clock: Callable[[], float] = time.process_time,
) -> list[Timings]:
    """Warm up each variant in turn, run one untimed round, then time `schedule.intervals`
    rounds, each one interval of `schedule.steps_per_interval` steps of every variant, in
    `round_orders`' order, each after its untimed lead-in (`lead_in_steps`).

    `runs[v](n)` must run n steps of variant v and return only once they are done (it
    fetches a value to the host). Interval i of every variant belongs to round i: pairs of
    them share the machine's load of that moment.
    """
    steps_per_interval = schedule.steps_per_interval
    lead_in = lead_in_steps(len(runs), steps_per_interval)
    for run in runs:  # warm-up: tracing, compilation, allocator and pipeline start-up
        for _ in range(warmup_intervals(schedule.warmup_steps, steps_per_interval)):
            run(steps_per_interval)
    # An untimed round: the variants' alternation reaches its steady state (the caches each
    # leaves to the next, a stream's pipeline refilling behind its intervals) before the
    # clock runs.
    for run in runs:
        run(steps_per_interval)
    timings = [Timings() for _ in runs]
    origin: float | None = None
    for order in round_orders(len(runs), schedule.intervals):
        for variant in order:
            if lead_in:
                runs[variant](lead_in)
            start, cpu_start = clock(), cpu_clock()
            origin = start if origin is None else origin
            runs[variant](steps_per_interval)
            timings[variant].seconds.append(clock() - start)
            timings[variant].cpu_seconds.append(cpu_clock() - cpu_start)
            timings[variant].starts.append(start - origin)
    return timings
