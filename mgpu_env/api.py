"""The Python API for your own training script: the strategy and the facts the settings decide.

    import mgpu_env

    strategy = mgpu_env.strategy()          # before the first layer: devices and precision
    batch = mgpu_env.global_batch_size(64)  # 64 per replica, times every replica
    with strategy.scope():
        model = build()
    ...
    if mgpu_env.is_chief():
        model.save(mgpu_env.run_dir() / "model.keras")   # run_dir() exists on the chief

Under `mgpu run script.py` these reflect the run: the launcher has resolved the settings,
applied them (GPUS, VIRTUAL_DEVICES, MIXED_PRECISION, WORKER_HOSTS -> TF_CONFIG) and hands
its `Runtime` over before the script starts. In plain `python script.py` the first call
resolves the same settings itself (flags aside: environment > `.env` > default), with the
same rules and errors (`mgpu_env.config.settings.SettingsErrors`), and `strategy()` splits
the devices and sets the Keras precision policy before it builds the strategy, so call it
before the script builds a layer or touches a device.

Importing `mgpu_env` stays light: nothing here imports TensorFlow until `strategy()`.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mgpu_env.config.resolve import ResolvedSettings
    from mgpu_env.runtime import Runtime
    from mgpu_env.runtime.keras import Command

__all__ = ["global_batch_size", "is_chief", "num_replicas", "run_dir", "runtime",
           "start_process", "strategy"]


@dataclass
class _ProcessState:
    """What this process has decided and built; each made once (see `runtime()`)."""

    runtime: Runtime | None = None
    tensorflow_prepared: bool = False  # device split and precision policy applied
    strategy: Any = None
    run_dir: Path | None = None


_STATE = _ProcessState()
_LOCK = threading.RLock()


def adopt(runtime: Runtime, *, tensorflow_prepared: bool) -> None:
    """Use the launcher's runtime (`mgpu run`), so the script sees the run's decisions.

    Not for scripts: `mgpu run` calls it before the script starts.
    """
    with _LOCK:
        _STATE.runtime = runtime
        _STATE.tensorflow_prepared = tensorflow_prepared
        _STATE.strategy = None
        _STATE.run_dir = None


def start_process(
    resolved: ResolvedSettings, command: Command, *, keras_2_code: str | None = None
) -> Runtime:
    """Make this process's decisions once, where every entry point starts (mgpu train, run
    and bench, and a script's first `runtime()`), from settings with the run folder already
    decided (`training.run.resume.resolve_run_settings`; bench names its own): build
    the runtime from the resolved settings (a GPU the machine lacks: ConfigError), write the
    environment TensorFlow reads (CUDA_VISIBLE_DEVICES, TF_CONFIG: before TensorFlow is
    imported), and keep it as this process's runtime, so code of the user's that calls
    `runtime()` sees the same one.
    `keras_2_code`: what `mgpu run`'s source scan found that only Keras 2 has (KERAS=auto
    then gives the script tf_keras)."""
    from mgpu_env.runtime import build_runtime

    built = build_runtime(resolved, command=command, keras_2_code=keras_2_code)
    built.apply()
    adopt(built, tensorflow_prepared=False)
    return built


def runtime() -> Runtime:
    """This process's `Runtime`: the resolved settings and every decision made from them
    (GPU selection, device split, precision, strategy plan, cluster).

    Outside `mgpu run`, the first call resolves the settings from the environment and the
    settings file, asks NVML, and writes the environment TensorFlow will read
    (CUDA_VISIBLE_DEVICES, TF_CONFIG); it imports no TensorFlow. Raises SettingsErrors or
    ConfigError for settings that cannot work, with the message `mgpu train` would print.
    """
    with _LOCK:
        if _STATE.runtime is None:
            from mgpu_env.training.run.resume import resolve_script_settings

            # A script of the user's, as under `mgpu run`.
            return start_process(resolve_script_settings({}, os.environ), "run")
        return _STATE.runtime


def strategy() -> Any:
    """The `tf.distribute` strategy the settings describe, created once per process.

    MirroredStrategy over the selected GPUs (or VIRTUAL_DEVICES logical devices), with the
    chosen all-reduce (CROSS_DEVICE_OPS); MultiWorkerMirroredStrategy when TF_CONFIG or
    WORKER_HOSTS names a cluster. The first call also splits the devices and sets the Keras
    mixed-precision policy (MIXED_PRECISION), which layers read when they are built.
    Raises RunFailed when TensorFlow has already started with other devices.
    """
    with _LOCK:
        if _STATE.strategy is None:
            execution = runtime().execution
            if not _STATE.tensorflow_prepared:
                execution.prepare_tensorflow()
                _STATE.tensorflow_prepared = True
            _STATE.strategy = execution.make_strategy()
        return _STATE.strategy


def num_replicas() -> int:
    """Replicas of the whole run: this process's devices times the workers."""
    return runtime().replicas


def global_batch_size(per_replica: int) -> int:
    """The batch one step takes across every replica, for `per_replica` samples each.

    Batch a `tf.data.Dataset` by it and distribute it with
    `strategy.experimental_distribute_dataset`; scale each replica's loss by it
    (`tf.nn.compute_average_loss(..., global_batch_size=...)`).
    """
    if per_replica < 1:
        raise ValueError(f"per_replica must be a positive number of samples, not {per_replica}")
    return per_replica * num_replicas()


def is_chief() -> bool:
    """Whether this process writes the run's outputs: always, but for the non-chief
    workers of a multi-worker run."""
    return runtime().role.is_chief


def run_dir() -> Path:
    """The run folder: OUTPUT_DIR, else `runs/<RUN_NAME>`, else `runs/<UTC timestamp>`
    (decided once per process). The chief creates it on the first call, so
    `model.save(run_dir() / "model.keras")` works at once; the other workers of a
    multi-worker run write nothing there and get its path only. Set RUN_NAME or OUTPUT_DIR
    so a restarted script finds its checkpoints again."""
    with _LOCK:
        if _STATE.run_dir is None:
            from mgpu_env.training.run.rundir import run_folder

            folder = run_folder(runtime().settings)  # decided by `resolve_run_settings`
            if is_chief():
                folder.mkdir(parents=True, exist_ok=True)
            _STATE.run_dir = folder
        return _STATE.run_dir


def _reset() -> None:
    """Forget everything (tests)."""
    with _LOCK:
        _STATE.__dict__.update(_ProcessState().__dict__)
