"""What `local.supervise` starts and restarts, and what it hands a recovery.

The shape every
supervised plan has (`Supervised`: `--workers N`'s `LocalWorkers`, one supervised
`mgpu train`), the failure that ended an attempt (`Ended`) and the decision of the next one
(`Recovery`)."""

from __future__ import annotations

import collections
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


class StderrKept:
    """What a process's stderr leaves for the supervisor: its last LAST_LINES lines and its
    first `error: ` line (a stall report's first line names the phase; the threads'
    stacks after it can push it out of the last lines)."""

    def __init__(self) -> None:
        self.last: collections.deque[str] = collections.deque(maxlen=LAST_LINES)
        self.first_error: str | None = None

    def add(self, line: str, tag: str) -> None:
        """One line as the process wrote it (`tag`: the supervisor's prefix, when it has it)."""
        text = line.rstrip("\n")
        self.last.append(text)
        bare = text[len(tag):] if text.startswith(tag) else text
        if self.first_error is None and bare.startswith("error: "):
            self.first_error = bare[len("error: "):].rstrip()

    def lines(self) -> tuple[str, ...]:
        """The lines a recovery reads: the first error line, then the last lines."""
        if self.first_error is None or any(self.first_error in line for line in self.last):
            return tuple(self.last)
        return (f"error: {self.first_error}", *self.last)
