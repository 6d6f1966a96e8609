"""What `mgpu train` shows while it trains: the terminal's bar carries samples/s like the
piped line does."""

from __future__ import annotations

import io

from mgpu_env.training.run.progress import Progbar, epoch_line


def test_progress_bar_shows_samples_per_second() -> None:
    stream, echoed = io.StringIO(), []
    bar = Progbar(echoed.append, samples_per_step=128, stream=stream)
    bar.epoch_begin(1, 5, 10)
    bar.steps_done(5, 0.5, 0.8)
    record = {"epoch": 1, "loss": 0.41, "accuracy": 0.887, "samples_per_sec": 2124.0,
              "seconds": 0.6}
    bar.epoch_end(record)
    drawn = stream.getvalue()
    assert echoed == ["Epoch 1/5"]
    assert "samples/s" in drawn.split("\r")[1]
    final = drawn.split("\r")[-1]
    assert final.endswith("\n") and "10/10 [" in final
    # The bar ends on the numbers of the piped line.
    assert "2,124 samples/s" in final and "2,124 samples/s" in epoch_line(record, 5)
    assert "loss 0.4100" in final and "accuracy 0.8870" in final
