"""What `local.supervise` starts and restarts, and what it hands a recovery.

The shape every
supervised plan has (`Supervised`: `--workers N`'s `LocalWorkers`, one supervised
`mgpu train`), the failure that ended an attempt (`Ended`) and the decision of the next one
(`Recovery`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from mgpu_env.config.exitcodes import exit_for_signal


class Supervised(Protocol):
    """What `supervise` starts: `count` processes, each with its environment, name and line
    tag, and the plan of a restart. `LocalWorkers` is one; a single supervised run
    (`recovery.supervise.OneRun`) another."""

    @property
    def count(self) -> int: ...

    def environment(self, index: int) -> dict[str, str]: ...

    def name(self, index: int) -> str: ...

    def tag(self, index: int) -> str: ...

    def renewed(self, ports: Callable[[int], list[int]]) -> Supervised: ...


@dataclass(frozen=True)
class Ended:
    """An attempt's first failure: which process, how it ended, its last lines on stderr
    (what a recovery reads: the stall's phase, a GPU named in the error)."""

    index: int
    returncode: int
    last_lines: tuple[str, ...]

    @property
    def code(self) -> int:
        """As a shell reports it: killed by signal N is 128 + N."""
        return exit_for_signal(-self.returncode) if self.returncode < 0 else self.returncode


# Decides the next attempt after a failure: its plan, or None to stop (having said why).
Recovery = Callable[[Ended, Supervised], Supervised | None]
LAST_LINES = 200
