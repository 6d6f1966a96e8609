"""One position type: the checkpoint's name `Position.name` writes is the one `parse` reads
back, every other name is refused, and positions order as the run goes."""

from __future__ import annotations

import itertools

import pytest

from mgpu_env.training.shared.position import Position

GRID = [Position(e, s) for e, s in itertools.product((0, 1, 2, 9, 10, 123), (0, 1, 7, 10, 150))]


def test_every_position_round_trips_through_its_name() -> None:
    for position in GRID:
        assert Position.parse(position.name) == position
        prefix, number = position.manager_name
        # tf.train.CheckpointManager names its save `<checkpoint_name>-<checkpoint_number>`.
        assert f"{prefix}-{number}" == position.name


@pytest.mark.parametrize("name", [
    "ckpt", "ckpt-", "ckpt-1-", "ckpt-01", "ckpt-1-0", "ckpt-1-01", "ckpt--1", "ckpt-+1",
    "ckpt-1-2-3", "ckpt-1.index", "CKPT-1", " ckpt-1", "ckpt-1 ", "model-1", "ckpt-1-x",
    "ckpt-\u0661", "",  # an Arabic-Indic 1: a digit to `\d`, not to a name mgpu writes
])
def test_a_name_position_never_writes_is_refused(name: str) -> None:
    assert Position.parse(name) is None


def test_positions_order_as_the_run_goes() -> None:
    ordered = sorted(GRID, key=lambda p: (p.epoch, p.step))
    assert sorted(GRID) == ordered
    assert Position(1, 150) < Position(2) < Position(2, 1)
    assert Position(2, 150).describe() == "step 150 of epoch 3"
    with pytest.raises(ValueError, match="counts up from 0"):
        Position(-1)
