"""The signal rules of a training run (the slow tests send real signals to real runs)."""

from __future__ import annotations

import os
import signal

from mgpu_env.training.run.signals import Interrupted, StopRequest, stop_on_signals


def test_interrupted_exits_128_plus_the_signal() -> None:
    assert Interrupted("stopped", 15).exit_code == 143
    assert Interrupted("stopped", 2).exit_code == 130


def test_sigterm_becomes_a_stop_request_and_the_handler_is_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    stop = StopRequest()
    with stop_on_signals(stop):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
