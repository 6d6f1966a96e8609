"""Where a run stands: one type from the checkpoint's file name to the feed's first row.

`ckpt-<E>` at the end of epoch E, `ckpt-<E>-<S>` after S steps of epoch E + 1: `Position.name`
writes it, `Position.parse` reads it back and refuses every other name (a leading zero, a
`-0` step, a sign, a suffix), so the name a save writes and the name a resume reads cannot
drift apart. Below the training folders (no TensorFlow): run/ saves, restores and plans at
a position, and every feed starts from one (`Feed.source(start)`: its order's rows from step
`start.step` of epoch `start.epoch + 1`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# What `name` writes: ckpt-<epochs completed>, and -<steps done of the next> inside an epoch
# (never `-0`, never a leading zero): the one pattern a checkpoint's name matches.
_NAME = re.compile(r"ckpt-(0|[1-9][0-9]*)(?:-([1-9][0-9]*))?")
# tf.train.CheckpointManager names a save `<checkpoint_name>-<checkpoint_number>`.
_MANAGER_PREFIX = "ckpt"


@dataclass(frozen=True, order=True)
class Position:
    """Where a run stands: `epoch` epochs completed and `step` steps done of the next.
    Ordered as the run goes: (epoch, step)."""

    epoch: int
    step: int = 0

    def __post_init__(self) -> None:
        if self.epoch < 0 or self.step < 0:
            raise ValueError(f"a position counts up from 0: epoch {self.epoch}, "
                             f"step {self.step}")

    @property
    def name(self) -> str:
        """The checkpoint's file prefix (`parse` reads it back)."""
        return f"ckpt-{self.epoch}" if not self.step else f"ckpt-{self.epoch}-{self.step}"

    @classmethod
    def parse(cls, name: str) -> Position | None:
        """The position a checkpoint's name `name` stands for; None for any name `name`
        never writes."""
        found = _NAME.fullmatch(name)
        if found is None:
            return None
        return cls(int(found.group(1)), int(found.group(2) or 0))

    @property
    def manager_name(self) -> tuple[str, int]:
        """(checkpoint_name, checkpoint_number) for tf.train.CheckpointManager, whose save
        is then named `name`."""
        if not self.step:
            return _MANAGER_PREFIX, self.epoch
        return f"{_MANAGER_PREFIX}-{self.epoch}", self.step

    def describe(self) -> str:
        if not self.step:
            return f"epoch {self.epoch}" if self.epoch else "the start"
        return f"step {self.step} of epoch {self.epoch + 1}"
