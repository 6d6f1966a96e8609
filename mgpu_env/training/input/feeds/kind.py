"""What a kind of feed is: the one small interface every data adapter has.

It holds that interface and the record a kind's module declares so the dispatcher
(`registry`) can choose it.

A feed (`Feed`) only says where its rows are, in order from a position
(`source(start, epochs)`: a `step.loops.Source`), how many steps an epoch has, and what it
is in words; the trainer runs the compiled loop over that source (`step.loops.StepLoops`),
as Keras' data adapters only yield and its trainer owns the loop. A kind of feed
(`FeedKind`) is a module of this package with a `KIND`: whether it takes a run's data
(`claims`, pure: the data's sizes and the keep limit, no TensorFlow), and how to build it
(`build`). No TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from mgpu_env.training.input.data.sets import Data, DataSizes, FileData
from mgpu_env.training.input.keep import GIB, KeepLimit, rows_bytes
from mgpu_env.training.shared.position import Position
from mgpu_env.training.step.loops import Source


@dataclass(frozen=True)
class FeedPlan:
    """How training batches will reach the step (the kind's name), the steps of an epoch,
    and why, in a short sentence for the start summary."""

    kind: str
    steps_per_epoch: int
    why: str

    def describe(self) -> dict[str, str | int]:
        return {"kind": self.kind, "steps_per_epoch": self.steps_per_epoch, "why": self.why}


@runtime_checkable
class Feed(Protocol):
    """What the trainer and the bench take from any feed: the steps of an epoch (the plan's,
    `FeedPlan.steps_per_epoch`, given to it when it is built), its rows from any position
    (`start`: where a checkpoint left the data; the steps before it are not trained, the
    ones after it are the order's next) for `epochs` epochs one after the other, and what
    the feed is, in words."""

    global_batch: int

    @property
    def steps_per_epoch(self) -> int: ...

    def describe(self) -> str: ...

    def source(self, start: Position, epochs: int = 1) -> Source: ...


@dataclass(frozen=True)
class FeedNeed:
    """What a kind sees when it is asked whether it takes a run's data: the data (or a
    built-in set's sizes, not read yet), the run's keep limit, the global batch and the
    workers."""

    data: Data | DataSizes
    keep: KeepLimit
    global_batch: int
    workers: int = 1

    @property
    def rows(self) -> int:
        return self.data.train_size

    @property
    def bytes(self) -> int:
        """The training rows on a device: float32 samples and int32 labels."""
        return rows_bytes(self.data.sample_shape, self.rows)

    @property
    def fits(self) -> bool:
        return self.keep.keeps(self.bytes)

    def what(self) -> str:
        """The rows, in words: `1,437 rows (5 MB)`."""
        decoded = "decoded " if isinstance(self.data, FileData) else ""
        return f"{self.rows:,} {decoded}rows ({_bytes(self.bytes)})"

    def limit(self) -> str:
        return f"the keep limit of {self.keep.bytes / GIB:.1f} GiB on each device"


@dataclass(frozen=True)
class FeedMaking:
    """What a kind's `build` is given: the strategy, the run's data and its feed plan, the
    global batch, SEED, DATA_DETERMINISTIC, and the steps its caller runs at once (None:
    training's calls)."""

    strategy: Any
    data: Data
    plan: FeedPlan
    global_batch: int
    seed: int
    deterministic: bool = True
    steps_per_call: int | None = None


@dataclass(frozen=True)
class FeedKind:
    """A kind of feed, as its module declares it (`KIND`): its name (the run's plan and
    metrics record it), its rank (kinds are asked in rising rank; the first that claims the
    data is the run's), whether it takes the data (`claims`: a FeedPlan, or None), how to
    build its feed, and how it brings the rows, in a few words (`mgpu bench`'s data source)."""

    name: str
    rank: int
    claims: Callable[[FeedNeed], FeedPlan | None]
    build: Callable[[FeedMaking], Feed]
    how: str


def whole_batches(need: FeedNeed) -> int:
    """Steps per epoch of rows cut into whole global batches (the last partial one dropped)."""
    return need.rows // need.global_batch


def _bytes(size: int) -> str:
    if size >= 1e9:
        return f"{size / 1e9:.1f} GB"
    return f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"

