"""The one dispatcher of feeds, choosing and building the kind that takes a run's data.

It lists every kind this package's modules declare, chooses the one that takes a run's data
(`plan_feed`) and builds it (`make_feed`).

A kind of feed is a module of this package with a `KIND` (`kind.FeedKind`); it is found here
by listing the package, so a new kind is one new module (and its tests): no list to extend,
and `mgpu bench` measures it through the same calls. `plan_feed` is decided once per run and
recorded in its plan (known before any data is read for a built-in set, whose sizes are
official; after `prepare` loads a loader's or a folder's data); `data.load_arrays` and
`mgpu bench` ask it too. No TensorFlow is imported by choosing.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path

from mgpu_env.training.input.data.sets import Data, DataSizes
from mgpu_env.training.input.feeds.kind import Feed, FeedKind, FeedMaking, FeedNeed, FeedPlan
from mgpu_env.training.input.keep import KeepLimit


@functools.cache
def kinds() -> tuple[FeedKind, ...]:
    """Every kind of feed, in the order they are asked (their rank)."""
    found = []
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        declared = getattr(importlib.import_module(f"{__package__}.{module.name}"), "KIND", None)
        if isinstance(declared, FeedKind):
            found.append(declared)
    return tuple(sorted(found, key=lambda kind: (kind.rank, kind.name)))


def kind_named(name: str) -> FeedKind:
    """The kind a feed plan names."""
    for kind in kinds():
        if kind.name == name:
            return kind
    raise ValueError(f"no kind of feed is named {name!r}; the kinds are "
                     f"{', '.join(k.name for k in kinds())}")


def plan_feed(
    data: Data | DataSizes, keep: KeepLimit, global_batch: int, workers: int = 1
) -> FeedPlan:
    """The feed for `data` under the run's `keep` limit: the first kind, by rank, that claims
    it. `DataSizes` stands for a built-in set's arrays, not read yet."""
    need = FeedNeed(data, keep, global_batch, workers)
    for kind in kinds():
        if (plan := kind.claims(need)) is not None:
            return plan
    raise ValueError(f"no kind of feed takes {type(data).__name__} data")  # arrays: `stream`


def make_feed(making: FeedMaking) -> Feed:
    """The feed the run's feed plan names, built by its kind with the plan's steps per
    epoch. `making.steps_per_call`: the steps its caller runs at once (default: training's)."""
    return kind_named(making.plan.kind).build(making)
