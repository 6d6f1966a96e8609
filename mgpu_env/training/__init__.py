"""The packaged training, from the plan to the finished run.

The packaged training: plan, loop, steps, signals, run folder, data, model, precision, strategy
and multi-worker. TensorFlow is imported inside functions, after GPU selection.

`train(runtime, preflight=...)` and `dry_run(runtime, preflight=...)` are `mgpu train` as
library calls (`run/trainer.py`: the whole sequence, in order); they are loaded on first
use, so importing a module of this package does not import the plan's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mgpu_env.training.run.trainer import dry_run, train

__all__ = ["dry_run", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from mgpu_env.training.run import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
