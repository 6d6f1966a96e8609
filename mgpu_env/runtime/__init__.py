"""Every decision a command needs, made once from the resolved settings, before TensorFlow.

    runtime = build_runtime(resolved)    # NVML snapshot, GPU selection, device split,
                                         # precision, strategy plan, cluster, environment
    runtime.apply()                      # the process environment TensorFlow will read
    runtime.execution.prepare_tensorflow()  # TensorFlow: device split, precision, Keras
    strategy = runtime.execution.make_strategy()  # the tf.distribute strategy planned

`mgpu train`, `mgpu bench` (the parent, and each child through `Execution`), the doctor's
pre-flight and `mgpu run` all take a `Runtime`; nothing downstream selects GPUs, splits
devices, picks a precision, an all-reduce or the Keras (`runtime/keras.py`) again.
Building it imports no TensorFlow, so a bad combination of settings fails in milliseconds
(ConfigError, exit 2).

`Execution` is the part another process needs to start TensorFlow the decided way (the
environment, the split, the precision, the strategy plan); it travels as JSON.

This file only names them: `record.py` decides (`decide`: each part by its one rule, and
why a part failed, as `Decisions`, which the doctor judges without deciding again; its
`runtime()` is `decide_runtime`'s result), `decisions.py` holds `Runtime` and the machine's
facts (`Machine`), `Execution` is in `execution.py`. They load on first use, so importing
`runtime.cluster` or `runtime.strategy` does not probe the machine's modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mgpu_env.runtime.decisions import (
        ExecutionRequest,
        Machine,
        Runtime,
        decide_execution,
        probe_machine,
    )
    from mgpu_env.runtime.execution import DEFAULT_TF_LOG_LEVEL, Execution, apply_environment
    from mgpu_env.runtime.record import (
        Decisions,
        build_runtime,
        decide,
        decide_runtime,
        nccl_available,
    )

_HOMES = {
    "ExecutionRequest": "decisions", "Machine": "decisions", "Runtime": "decisions",
    "build_runtime": "record", "decide_execution": "decisions", "Decisions": "record",
    "decide": "record", "decide_runtime": "record", "nccl_available": "record",
    "probe_machine": "decisions", "DEFAULT_TF_LOG_LEVEL": "execution",
    "Execution": "execution", "apply_environment": "execution",
}
__all__ = [
    "DEFAULT_TF_LOG_LEVEL", "Decisions", "Execution", "ExecutionRequest", "Machine", "Runtime",
    "apply_environment", "build_runtime", "decide", "decide_execution", "decide_runtime",
    "nccl_available", "probe_machine",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
