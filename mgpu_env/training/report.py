"""What a training run tells the user while it trains: nothing, one line per epoch, or
Keras' progress bar."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class Reporter:
    """What the run tells the user while it trains. The default prints nothing."""

    def note(self, message: str) -> None:
        """A one-line remark (resuming, data loaded, ...)."""

    def epoch_begin(self, epoch: int, epochs: int, steps: int) -> None:
        """Epoch `epoch` (1-based) of `epochs` starts, with `steps` steps."""

    def steps_done(self, steps: int, loss: float, accuracy: float) -> None:
        """`steps` steps of the current epoch are done; running loss and accuracy."""

    def epoch_end(self, record: Mapping[str, Any]) -> None:
        """The epoch finished; `record` is its history entry."""


class EpochLineReporter(Reporter):
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


class ProgbarReporter(Reporter):
    """Keras' per-epoch progress bar, like `model.fit(verbose=1)`: for a terminal only (it
    redraws the line with `\\r` and colours it)."""

    def __init__(self, echo: Callable[[str], None] = print) -> None:
        self._echo = echo
        self._bar: Any = None

    def note(self, message: str) -> None:
        self._echo(message)

    def epoch_begin(self, epoch: int, epochs: int, steps: int) -> None:
        from mgpu_env.runtime.keras import tensorflow_keras

        keras = tensorflow_keras()

        self._echo(f"Epoch {epoch}/{epochs}")
        self._bar = keras.utils.Progbar(steps, stateful_metrics=["loss", "accuracy"])

    def steps_done(self, steps: int, loss: float, accuracy: float) -> None:
        if self._bar is not None:
            self._bar.update(steps, [("loss", loss), ("accuracy", accuracy)])

    def epoch_end(self, record: Mapping[str, Any]) -> None:
        self._bar = None


