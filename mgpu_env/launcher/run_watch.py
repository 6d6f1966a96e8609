"""The stall watch of a script under `mgpu run`, its phases seen where they happen.

Each phase is bounded by STALL_TIMEOUT (`training.multiworker.stall.StallWatch`, exit 3).

A script is code mgpu did not write, so its phases are read from the few places its run
passes through:

- starting: mgpu's own start (TensorFlow's import, the pre-flight, the device split), until
  the script's first line;
- building the strategy: inside `StrategyBase.__init__` (`strategy_watch` calls `building`
  and `built`), where MultiWorkerMirroredStrategy waits for the other workers and NCCL's
  communicators are not yet made;
- the first step: from the first `strategy.run` (Keras' `fit` calls it once, as it traces
  its step function; a custom loop calls it itself) until the step function's first call
  returns: the trace, the compile and the collectives' set-up;
- training steps: each later call of a step function that returns is progress. A step
  function is a `tf.function` whose trace ran `strategy.run` (Keras' train function, a
  loop's `@tf.function def train_step`), or an eager `strategy.run`; other tf.functions
  (a metric's, a data map's) are not steps;
- evaluating: inside Keras' `Model.evaluate` (fit's validation calls it too: its data's
  first batch is fetched as the iterator is made, before `on_test_begin`) and `predict`;
- saving the checkpoint: inside `tf.train.Checkpoint._write` (what `save`, `write` and
  CheckpointManager all call) and Keras' `Model.save` / `save_weights` (ModelCheckpoint's);
- the script's own code: before its first strategy, between a `fit` and the next, after its
  steps: no bound (its data's load, its own work), which Keras' `on_train_end` starts again.

A script's loop of its own has no end that can be seen: its steps phase lasts until the
script ends, builds a strategy or starts a `fit`. The hooks and the watch add 7.6 us to a
call of a step function (measured: benchmarks/stall_watch_cost.py --only run).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from mgpu_env.runtime import Runtime
from mgpu_env.training.multiworker.stall import Among, StallWatch, Watched
from mgpu_env.training.multiworker.stallhints import (
    EVALUATING,
    FIRST_STEP,
    SAVING,
    SCRIPT_CODE,
    STARTING,
    STEPS,
    STRATEGY,
    Devices,
)

_MARK = "_mgpu_stall_watched"
# What a stall of a script leaves: mgpu wrote nothing of its own; the script's checkpoints
# are its own, and what it was writing when it stalled is as a kill -9 leaves it.
SAVED = ("Nothing of mgpu's was being written: the script's checkpoints are its own, as a "
         "kill -9 leaves them (tf.train.Checkpoint and Keras' BackupAndRestore replace their "
         "index last, so the previous one stays whole); run the script again to resume "
         "from them")


class _State:
    """The one watch of this process and what it has seen of the script's steps."""

    def __init__(self) -> None:
        self.watch: StallWatch | None = None
        self.step_functions: set[int] = set()  # ids of tf.functions whose trace ran a step
        self.calls = threading.local()  # .stack: the tf.function calls under way, outermost first
        self.evaluating = 0  # on_test_begin without its on_test_end yet
        self.saving = 0
        self.fitting = False  # inside Keras' fit (on_train_begin .. on_train_end)


_STATE = _State()


@contextlib.contextmanager
def stall_watch(runtime: Runtime) -> Iterator[StallWatch]:
    """Watch this process's run (STALL_TIMEOUT) inside, from STARTING: enter before
    TensorFlow starts (`prepare`), leave after the script; disarmed however it is left."""
    watch = start_watch(runtime)
    try:
        yield watch
    finally:
        watch.stop()
        if _STATE.watch is watch:
            _STATE.watch = None


def start_watch(runtime: Runtime) -> StallWatch:
    """The run's watch, on the planned devices, in STARTING (a watch left armed before is
    stopped). A worker's report names the worker."""
    if _STATE.watch is not None:
        _STATE.watch.stop()
    plan, cluster = runtime.strategy_plan, runtime.cluster
    devices = Devices(runtime.replicas, runtime.device_type, plan.cross_device_ops,
                      nccl_variables(), plan.role.num_workers)
    among = None if cluster is None else Among(cluster.name, cluster.line_tag)
    watch = StallWatch(runtime.settings.stall_timeout, Watched(devices, SAVED, among))
    _STATE.watch = watch
    watch.phase(STARTING)
    return watch


@contextlib.contextmanager
def script_running() -> Iterator[None]:
    """The script runs inside, from its own code (unbounded); its end, however it ends,
    disarms the watch (before mgpu's notes after it)."""
    _phase(SCRIPT_CODE)
    try:
        yield
    finally:
        if _STATE.watch is not None:
            _STATE.watch.stop()
            _STATE.watch = None


def _phase(name: str) -> None:
    if _STATE.watch is not None:
        _STATE.watch.phase(name)


def strategy_built() -> None:
    """A strategy's constructor returned (`strategy_watch`): the script's code again."""
    if _STATE.watch is not None and _STATE.watch.current == STRATEGY:
        _STATE.watch.phase(SCRIPT_CODE)


def _extended_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    # Every strategy's extended calls this first, before it sets up its devices (and,
    # between workers, joins the cluster); `strategy_built` ends the phase.
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _phase(STRATEGY)
        original(self, *args, **kwargs)
    return __init__


def _stack() -> list[int]:
    stack: list[int] | None = getattr(_STATE.calls, "stack", None)
    if stack is None:
        stack = _STATE.calls.stack = []
    return stack


def step_seen() -> None:
    """`strategy.run` was called (`run_observer`): in a tf.function's trace, that function
    (the outermost being called) is a step function; the first one starts the first step."""
    watch = _STATE.watch
    if watch is None:
        return
    stack = _stack()
    if stack:
        _STATE.step_functions.add(stack[0])
    if watch.current not in (FIRST_STEP, STEPS, EVALUATING, SAVING):
        watch.phase(FIRST_STEP)


def step_done() -> None:
    """A step function's call returned (or an eager `strategy.run`): progress."""
    watch = _STATE.watch
    if watch is None:
        return
    if _STATE.evaluating:
        watch.phase(EVALUATING)
    elif watch.current in (FIRST_STEP, STEPS):
        watch.call_done()


def _function_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _STATE.watch is None:
            return original(self, *args, **kwargs)
        stack = _stack()
        stack.append(id(self))
        try:
            result = original(self, *args, **kwargs)
        finally:
            stack.pop()
        # Only an outermost call ran the step: a nested one only traced into it.
        if not stack and id(self) in _STATE.step_functions:
            step_done()
        return result
    return __call__


def eager_run_done() -> None:
    """An eager `strategy.run` (a loop without tf.function) returned."""
    if not _stack():
        step_done()


@contextlib.contextmanager
def saving() -> Iterator[None]:
    """A checkpoint's write runs inside; the phase before it goes on after."""
    watch = _STATE.watch
    if watch is None or _STATE.saving:
        yield
        return
    before = watch.current
    _STATE.saving += 1
    watch.phase(SAVING)
    try:
        yield
    finally:
        _STATE.saving -= 1
        watch.phase(before)


def _saving_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def save(*args: Any, **kwargs: Any) -> Any:
        with saving():
            return original(*args, **kwargs)
    return save


def _callback_wrapper(event: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
            _callback(event)
            return original(self, *args, **kwargs)
        return hook
    return make


def _evaluate_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        watch = _STATE.watch
        if watch is None:
            return original(self, *args, **kwargs)
        _STATE.evaluating += 1
        watch.phase(EVALUATING)
        try:
            return original(self, *args, **kwargs)
        finally:
            _STATE.evaluating -= 1
            # fit's validation ends: its steps go on; `evaluate` alone: the script's code.
            if not _STATE.evaluating:
                watch.phase(STEPS if _STATE.fitting else SCRIPT_CODE)
    return evaluate


def _callback(event: str) -> None:
    watch = _STATE.watch
    if watch is None:
        return
    if event == "on_train_begin":
        _STATE.fitting = True
        watch.phase(FIRST_STEP)
    elif event == "on_train_end":
        _STATE.fitting = False
        watch.phase(SCRIPT_CODE)


def _wrap(owner: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]
          ) -> None:
    """Replace `owner.name` (its own or inherited: Keras 3's Model has its trainer's
    `evaluate`) with `make(it)`, once."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, _MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _MARK, True)
    setattr(owner, name, wrapper)


CALLBACK_EVENTS = ("on_train_begin", "on_train_end")


def hook_tensorflow() -> None:
    """Install the hooks on TensorFlow (tf.function's call, Checkpoint's write); with a
    Keras loaded, on its callbacks and saves (`hook_keras`). Idempotent."""
    if _STATE.watch is None:
        return
    from tensorflow.python.checkpoint import checkpoint
    from tensorflow.python.distribute import distribute_lib
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    _wrap(distribute_lib.StrategyExtendedV2, "__init__", _extended_wrapper)
    _wrap(polymorphic_function.Function, "__call__", _function_wrapper)
    _wrap(checkpoint.Checkpoint, "_write", _saving_wrapper)
    hook_keras()


def hook_keras() -> None:
    """Keras 3's and tf_keras' CallbackList events and Model saves, for those loaded."""
    import sys

    if _STATE.watch is None:
        return
    # Where each Keras, once loaded, defines CallbackList and Model (Keras 3, tf_keras).
    for callbacks, models in (("keras.src.callbacks.callback_list", "keras.src.models.model"),
                              ("tf_keras.src.callbacks", "tf_keras.src.engine.training")):
        if callbacks not in sys.modules or models not in sys.modules:
            continue
        callback_list = sys.modules[callbacks].CallbackList
        model = sys.modules[models].Model
        for event in CALLBACK_EVENTS:
            _wrap(callback_list, event, _callback_wrapper(event))
        for name in ("save", "save_weights"):
            _wrap(model, name, _saving_wrapper)
        for name in ("evaluate", "predict"):
            _wrap(model, name, _evaluate_wrapper)


def nccl_variables() -> dict[str, str]:
    """The NCCL variables set (for the hints)."""
    return {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}


__all__ = ["Devices", "eager_run_done", "hook_keras", "hook_tensorflow",
           "nccl_variables", "saving", "script_running", "stall_watch", "start_watch", "step_seen",
           "strategy_built"]
