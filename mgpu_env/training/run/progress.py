"""What a training run tells the user while it trains.

That is nothing, one line per epoch, or a progress bar."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO


class Progress:
    """What the run tells the user while it trains. The default prints nothing."""

    def note(self, message: str) -> None:
        """A one-line remark (resuming, data loaded, ...)."""

    def epoch_begin(self, epoch: int, epochs: int, steps: int) -> None:
        """Epoch `epoch` (1-based) of `epochs` starts, with `steps` steps."""

    def steps_done(self, steps: int, loss: float, accuracy: float) -> None:
        """`steps` steps of the current epoch are done; running loss and accuracy."""

    def epoch_end(self, record: Mapping[str, Any]) -> None:
        """The epoch finished; `record` is its history entry."""


class EpochLines(Progress):
    """One plain line per epoch, for logs, CI and pipes: no `\\r` redraws, no colour."""

    def __init__(self, echo: Callable[[str], None] = print) -> None:
        self._echo = echo
        self._epochs = 0

    def note(self, message: str) -> None:
        self._echo(message)

    def epoch_begin(self, epoch: int, epochs: int, steps: int) -> None:
        self._epochs = epochs

    def epoch_end(self, record: Mapping[str, Any]) -> None:
        self._echo(epoch_line(record, self._epochs))


def epoch_line(record: Mapping[str, Any], epochs: int) -> str:
    """`Epoch 2/5: loss 0.4121, accuracy 0.8870, 2,124 samples/s, 0.7 s`."""
    return (
        f"Epoch {record['epoch']}/{epochs}: loss {record['loss']:.4f}, "
        f"accuracy {record['accuracy']:.4f}, {record['samples_per_sec']:,.0f} samples/s, "
        f"{record['seconds']:.1f} s"
    )


class Progbar(Progress):
    """A progress bar redrawn in place, like `model.fit(verbose=1)`'s, for a terminal only
    (it redraws the line with `\\r`): steps, loss, accuracy and samples/s as the epoch goes,
    ending on the numbers the piped line (`epoch_line`) prints."""

    WIDTH = 30  # the bar's characters, as Keras' Progbar draws it

    def __init__(
        self, echo: Callable[[str], None] = print, *, samples_per_step: int,
        stream: TextIO | None = None,
    ) -> None:
        self._echo = echo
        self._samples_per_step = samples_per_step
        self._stream = stream or sys.stdout
        self._steps = 0
        self._started = 0.0
        self._drawn = 0

    def note(self, message: str) -> None:
        self._echo(message)

    def epoch_begin(self, epoch: int, epochs: int, steps: int) -> None:
        self._echo(f"Epoch {epoch}/{epochs}")
        self._steps, self._started, self._drawn = steps, time.perf_counter(), 0

    def steps_done(self, steps: int, loss: float, accuracy: float) -> None:
        seconds = time.perf_counter() - self._started
        rate = steps * self._samples_per_step / seconds if seconds > 0 else 0.0
        self._draw(steps, loss, accuracy, rate, seconds)

    def epoch_end(self, record: Mapping[str, Any]) -> None:
        # The epoch's own numbers, so the bar ends on what history.json and the piped line say.
        self._draw(self._steps, record["loss"], record["accuracy"],
                   record["samples_per_sec"], record["seconds"])
        self._stream.write("\n")
        self._stream.flush()

    def _draw(self, steps: int, loss: float, accuracy: float, rate: float,
              seconds: float) -> None:
        done = self.WIDTH * steps // max(self._steps, 1)
        bar = "=" * done + (">" + "." * (self.WIDTH - done - 1) if done < self.WIDTH else "")
        line = (
            f"{steps}/{self._steps} [{bar}] {seconds:.1f} s - loss {loss:.4f} - "
            f"accuracy {accuracy:.4f} - {rate:,.0f} samples/s"
        )
        # Spaces cover what a longer line drawn before left on the screen.
        self._stream.write("\r" + line + " " * max(self._drawn - len(line), 0))
        self._stream.flush()
        self._drawn = len(line)


