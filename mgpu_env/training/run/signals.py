"""SIGTERM and SIGINT during training: stop at the next step boundary, with a checkpoint there.

`docker stop` (and Slurm's `--signal=TERM@...`) sends SIGTERM; the loop checks `StopRequest`
after every call of the step function (at most STEPS_PER_CALL steps), saves a checkpoint
there (`epochs.save_inside_epoch`), raises `Interrupted` with the resume command, and the
CLI exits 128 + the signal number.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType

from mgpu_env.config.errors import RunFailed
from mgpu_env.config.exitcodes import exit_for_signal


class Interrupted(RunFailed):
    """SIGTERM/SIGINT stopped training; a checkpoint was saved where it stopped.

    Exit code 128 + the signal number (143 for SIGTERM, 130 for SIGINT), the shell's and
    Docker's convention for "terminated by a signal": a wrapper or scheduler can tell a
    resumable interruption from a failure (1) or a bad configuration (2).
    """

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = exit_for_signal(signum)

    def user_message(self) -> str:
        """The message alone: a stop that was asked for is not an error (`SIGTERM received:
        training stopped ...`); the exit code still says a signal ended the run."""
        return str(self)



@dataclass
class StopRequest:
    """Set by SIGTERM/SIGINT; the loop stops at the next step boundary."""

    signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None


@contextlib.contextmanager
def stop_on_signals(stop: StopRequest) -> Iterator[None]:
    """Turn SIGTERM and SIGINT into a stop request; a second SIGINT interrupts at once."""

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.signum = signum

    previous = {}
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, handle)
    except ValueError:
        pass  # Not the main thread (e.g. a test runner's worker): no handlers then.
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


