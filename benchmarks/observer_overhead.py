"""What `mgpu run`'s observation of a run adds to each call it watches, after the first.

    .venv/bin/python benchmarks/observer_overhead.py

`launcher/run_observer.py` wraps calls that run per step in an eager loop: a Keras layer's
`__call__`, a strategy's `run`. After the first call of each object a wrapper does one set
lookup and calls the original. Measured here on a do-nothing original, so what is printed
is the wrapper alone (min of 7 rounds of 200000 calls); a Keras layer's eager call costs
tens to hundreds of microseconds, and inside a `tf.function` the wrappers run only while it
traces. No TensorFlow is imported.
"""

from __future__ import annotations

import timeit
from typing import Any

from mgpu_env.launcher import run_observer

CALLS = 200_000


class _Model:
    """Stands for the Keras Model class, which the layer wrapper leaves out."""


class _Layer:
    """An object called through the wrappers."""


def _original(self: Any, *args: Any, **kwargs: Any) -> None:
    return None


def main() -> None:
    layer = _Layer()
    wrapped = {
        "Layer.__call__": run_observer._layer_wrapper(_Model)(_original),
        "Strategy.run": run_observer._run_wrapper(_original),
    }
    wrapped["Layer.__call__"](layer, 1)  # its first call: seen (no dtype: nothing recorded)
    run_observer._STEPPED.add(id(layer))  # as after a strategy's first step
    base = min(timeit.repeat(lambda: _original(layer, 1), number=CALLS, repeat=7)) / CALLS
    for name, function in wrapped.items():
        took = min(timeit.repeat(lambda f=function: f(layer, 1), number=CALLS,  # type: ignore[misc]
                                 repeat=7)) / CALLS
        print(f"{name} wrapper: +{(took - base) * 1e6:.2f} us per call "
              f"(the original alone: {base * 1e6:.2f} us)")
    run_observer._reset()


if __name__ == "__main__":
    main()
