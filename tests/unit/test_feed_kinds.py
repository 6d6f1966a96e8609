"""The kinds of feed and their one dispatcher (`training.input.feeds.registry`): every kind
is a module of the package, found by listing it; a run's data goes to the first kind, by
rank, that claims it; and nothing outside the package names a kind, so a new kind is one
module and `mgpu bench` measures it unedited."""

from __future__ import annotations

import importlib
import itertools
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

from mgpu_env.training.input import feeds
from mgpu_env.training.input.data import DataSizes, FileData, Streamed
from mgpu_env.training.input.data.sets import FilePart, Layout, RowStream
from mgpu_env.training.input.feeds import FeedNeed, kind_named, kinds, plan_feed
from mgpu_env.training.input.keep import GIB, KeepLimit
from tests.support.children import REPO


def _files(rows: int) -> FileData:
    part = FilePart(("/data/0.tfrecord", "/data/1.tfrecord"), (rows // 2, rows - rows // 2))
    return FileData("tfrecord:/data", "tfrecord", Path("/data"), Layout(), part,
                    FilePart(("/data/test.tfrecord",), (50,)), (8, 8, 1), 4)


def _stream(rows: int) -> Streamed:
    part = RowStream(rows=None, size=rows, sample_shape=(4,), max_label=2)
    return Streamed("m:load", part, part, 3)


DATA = [DataSizes(1_000, 10), DataSizes(60_000, 10_000, (28, 28, 1)), _files(400),
        _files(4_000), _stream(1_000)]
LIMITS = [KeepLimit(0, "none"), KeepLimit(65 * 4 * 400, "exactly 400 file rows"),
          KeepLimit(100 * GIB, "all")]


def _kind_modules() -> list[ModuleType]:
    """The package's modules that declare a kind, listed here independently of the registry."""
    modules = [importlib.import_module(f"{feeds.__name__}.{module.name}")
               for module in pkgutil.iter_modules(feeds.__path__)]
    return [module for module in modules if hasattr(module, "KIND")]


def test_every_module_that_declares_a_kind_is_found_in_rank_order() -> None:
    found = kinds()
    assert len(found) == len(_kind_modules()) >= 4
    assert [k.rank for k in found] == sorted(k.rank for k in found)
    assert len({k.name for k in found}) == len({k.rank for k in found}) == len(found)
    assert all(kind_named(k.name) is k and k.how for k in found)
    with pytest.raises(ValueError, match=r"no kind of feed is named 'tape'.*resident"):
        kind_named("tape")


@pytest.mark.parametrize(("data", "keep", "workers"),
                         itertools.product(DATA, LIMITS, (1, 2)))
def test_data_goes_to_the_first_kind_that_claims_it(
    data: DataSizes | FileData | Streamed, keep: KeepLimit, workers: int
) -> None:
    need = FeedNeed(data, keep, 16, workers)
    claims = [(kind.name, kind.claims(need)) for kind in kinds()]
    claimed = [(name, plan) for name, plan in claims if plan is not None]
    assert claimed, f"no kind takes {data}"
    name, plan = claimed[0]
    assert plan_feed(data, keep, 16, workers) == plan and plan is not None
    assert plan.kind == name and plan.steps_per_epoch > 0 and plan.why
    # What the kinds stand for: a loader's stream always streams; rows that fit are kept.
    fits = keep.keeps(need.bytes)
    expected = ("row_stream" if isinstance(data, Streamed) else "resident" if fits
                else "file_stream" if isinstance(data, FileData) else "stream")
    assert name == expected


def test_nothing_outside_the_feeds_names_a_kind() -> None:
    """The bench and the run read a kind's name from its plan, its words from its `KIND`
    and its rows from its source: a kind's feed named elsewhere would be a list to extend
    for every new kind. (BENCH_DATA's modes, `real` and `stream`, are the bench's words for
    a keep limit of all or none, not kinds.)"""
    names = [
        name for module in _kind_modules()
        for name, value in vars(module).items()
        if isinstance(value, type) and value.__module__ == module.__name__
        and name.endswith("Feed")
    ]
    assert len(names) >= len(kinds())  # every kind's feed class
    for folder in ("bench", "training/run", "training/step"):
        for path in (REPO / "mgpu_env" / folder).rglob("*.py"):
            text = path.read_text()
            assert not [n for n in names if n in text], path
