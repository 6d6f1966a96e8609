"""`mgpu run`: your script, or `-m package.module`, with every decision `mgpu train` makes.

    target = resolve_target(["train.py", "--lr", "0.1"], module=False)  # ConfigError: exit 2
    runtime = build_runtime(resolved); runtime.apply()   # GPUS, TF_CONFIG: before TensorFlow
    prepare(runtime)        # pre-flight, device split, precision policy, MirroredStrategy()
    code = run_target(target)                            # the script's exit code

Why in this process (`runpy`, as `python script.py` runs it) and not in a child: there is
one process, so `docker stop`'s SIGTERM (and Ctrl-C) reaches the script itself, with its
own handlers, and nothing has to forward signals or reap a child; `sys.exit(3)` is simply
this process's exit code; the script's exceptions carry the script's own frames; and the
API (`mgpu_env.strategy()`) reads the launcher's `Runtime` from memory instead of deciding
again. The cost: mgpu's own modules (typer, the settings) stay loaded under the script.

How the decisions reach a script that knows nothing of mgpu:
- GPUS, WORKER_HOSTS/WORKER_INDEX: `Runtime.apply()` has written CUDA_VISIBLE_DEVICES and
  TF_CONFIG before TensorFlow is imported;
- KERAS: `Runtime.apply()` has written TF_USE_LEGACY_KERAS=1 when `tf.keras` is to be Keras 2
  (tf_keras: between workers, where Keras 3 cannot train);
- VIRTUAL_DEVICES and MIXED_PRECISION: `Execution.prepare_tensorflow()` splits the devices
  and sets the global policy of the Keras `tf.keras` is before the script's first line, so
  its first layer takes the policy;
- the strategy: `tf.distribute.MirroredStrategy()` with no arguments takes TensorFlow's
  default devices (every GPU, or only CPU:0: never logical CPUs) and all-reduce; here its
  defaults become the planned devices and all-reduce (`_plan_mirrored_defaults`), so the
  tutorial's own `MirroredStrategy()` runs VIRTUAL_DEVICES replicas on a CPU too. Arguments
  the script passes win.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from mgpu_env import api
from mgpu_env.config.errors import ConfigError
from mgpu_env.config.settings import with_role
from mgpu_env.runtime import Runtime
from mgpu_env.runtime.keras import MULTI_WORKER_ISSUE, KerasChoice, keras_3_loaded
from mgpu_env.runtime.strategy import StrategyPlan

# Settings of the packaged loop that `mgpu run` does not apply (declared with the role
# "script"): the script has its own epochs, batch, optimizer, data and its order, model,
# seed, jit_compile, checkpoints and outputs.
SCRIPT_DECIDES = with_role("script")
# Python's own exit code for a script killed by an uncaught KeyboardInterrupt (128 + SIGINT).
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Target:
    """What `mgpu run` runs: a script file or a module, and the arguments it is given."""

    name: str  # the path as given, or the dotted module name
    is_module: bool
    args: tuple[str, ...]
    path: Path  # the script, or the module's file

    @property
    def argv(self) -> list[str]:
        """`sys.argv` as `python SCRIPT ARGS` or `python -m MODULE ARGS` would set it."""
        return [str(self.path) if self.is_module else self.name, *self.args]

    def describe(self) -> str:
        return f"-m {self.name}" if self.is_module else self.name


def resolve_target(words: Sequence[str], *, module: bool) -> Target:
    """SCRIPT [ARGS] (or MODULE [ARGS] with `module`), checked. Raises ConfigError (exit 2)
    when the script or module does not exist, before anything slow starts."""
    if not words:
        raise ConfigError(
            "mgpu run needs a script: mgpu run [SETTINGS] SCRIPT [ARGS]... or "
            "mgpu run [SETTINGS] -m package.module [ARGS]..."
        )
    name, args = words[0], tuple(words[1:])
    if module:
        return Target(name, True, args, _module_file(name))
    path = Path(name)
    if not path.is_file():
        reason = "is a folder" if path.is_dir() else "does not exist"
        raise ConfigError(
            f"mgpu run: the script {name} {reason} (working folder {os.getcwd()}).\n"
            "  Fix: give the path of a Python file, or -m package.module for a module."
        )
    return Target(name, False, args, path)


def _module_file(name: str) -> Path:
    # `python -m` searches the working folder first; so does this check, and `run_target`.
    _working_folder_first()
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as err:
        spec, reason = None, f" ({err})"
    else:
        reason = ""
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(f"{name}.__main__")  # a package runs its __main__
        if spec is None:
            raise ConfigError(
                f"mgpu run -m {name}: {name} is a package without a __main__ module.\n"
                f"  Fix: name the module inside it (-m {name}.train), or add "
                f"{name}/__main__.py."
            )
    if spec is None or spec.origin is None:
        raise ConfigError(
            f"mgpu run -m {name}: there is no module {name}{reason} (looked in the working "
            f"folder {os.getcwd()}, PYTHONPATH and the installed packages).\n"
            "  Fix: run from the folder that holds it, or add that folder to PYTHONPATH."
        )
    return Path(spec.origin)


def _working_folder_first() -> None:
    cwd = os.getcwd()
    if not sys.path or sys.path[0] not in (cwd, ""):
        sys.path.insert(0, cwd)


def prepare(runtime: Runtime) -> None:
    """Everything between an applied runtime and the script's first line: the pre-flight
    checks (RunFailed / ConfigError), the device split and precision policy, the defaults
    of `MirroredStrategy()`, and the runtime handed to `mgpu_env.strategy()`.

    Imports TensorFlow (the script would at once anyway); `runtime.apply()` must be done.
    """
    from mgpu_env.doctor import require_ready

    require_ready(runtime)
    runtime.execution.prepare_tensorflow()
    _plan_mirrored_defaults(runtime.strategy_plan)
    api.adopt(runtime, tensorflow_prepared=True)


def summary(runtime: Runtime, target: Target) -> list[str]:
    """What the script will get, on stderr before it starts (QUIET=1: nothing), so its own
    output on stdout stays its own."""
    plan = runtime.strategy_plan
    logical = " logical" if runtime.split.logical else ""
    lines = [
        f"mgpu run {target.describe()}: {plan.local_replicas} x{logical} {runtime.device_type}"
        f", {runtime.replicas} replica(s) ({plan.kind}), precision {runtime.precision.policy}"
        f", all-reduce {plan.cross_device_ops}, tf.keras {runtime.keras.label}"
    ]
    if (cluster := runtime.cluster_line()) is not None:
        lines.append(f"  cluster: {cluster}")
    if runtime.keras.version == "2" or runtime.settings.keras != "auto":
        lines.append(f"  keras: {runtime.keras.reason}")
    lines.extend(f"  note: {note}" for note in runtime.notes)
    not_applied = [
        f"{env}={runtime.settings.describe()[env]}" for env in SCRIPT_DECIDES
        if runtime.resolved.sources.get(env, "default") != "default"
    ]
    if not_applied:
        lines.append(
            f"  note: {', '.join(not_applied)}: mgpu train's settings, which your script "
            "decides for itself (they are in mgpu_env.api.runtime().settings)"
        )
    return lines


def _plan_mirrored_defaults(plan: StrategyPlan) -> None:
    """Make `tf.distribute.MirroredStrategy()`'s defaults the plan's devices and all-reduce."""
    import tensorflow as tf

    from mgpu_env.runtime.strategy import make_cross_device_ops

    if plan.kind != "mirrored":
        return  # a cluster: the script's MirroredStrategy() stays one worker's, as in TF
    tensorflow_default: Any = tf.distribute.MirroredStrategy
    if getattr(tensorflow_default, "_mgpu_plan", None) is not None:
        tensorflow_default = tensorflow_default.__mro__[1]  # prepared before (tests)

    class MirroredStrategy(tensorflow_default):  # type: ignore[misc, valid-type]
        __doc__ = tensorflow_default.__doc__
        _mgpu_plan = plan

        def __init__(self, devices: Any = None, cross_device_ops: Any = None) -> None:
            if devices is None:
                devices = list(plan.devices)
                if cross_device_ops is None:
                    cross_device_ops = make_cross_device_ops(plan)
            super().__init__(devices, cross_device_ops)

    MirroredStrategy.__module__ = tensorflow_default.__module__
    tf.distribute.MirroredStrategy = MirroredStrategy


def run_target(target: Target, *, cluster_keras: KerasChoice | None = None) -> int:
    """Run the target as `__main__` with `sys.argv` = [SCRIPT, *ARGS]; its exit code.

    `sys.exit(n)` gives n (None: 0; a message: printed, 1). An exception prints the
    script's traceback (from its own first frame, through `sys.excepthook` as Python
    would) and gives 1; Ctrl-C gives 130. Everything else the script does is its own.
    `cluster_keras`: the run's Keras when it is a cluster (None: one process); an
    exception there, with Keras 3 loaded, is followed by a note on why and how to fix it.
    """
    sys.argv = target.argv
    if target.is_module:
        _working_folder_first()
    else:
        # As `python script.py`: the script's folder first on sys.path.
        sys.path.insert(0, str(Path(target.name).resolve().parent))
    try:
        if target.is_module:
            runpy.run_module(target.name, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target.name, run_name="__main__")
    except SystemExit as stop:
        return _exit_status(stop.code)
    except KeyboardInterrupt as err:
        _print_user_traceback(err)
        return EXIT_INTERRUPTED
    except BaseException as err:  # the script's own error: its traceback, as Python shows it
        _print_user_traceback(err)
        if cluster_keras is not None and (
            note := keras_3_note(err, sys.modules, cluster_keras)
        ) is not None:
            print(note, file=sys.stderr, flush=True)
        return 1
    return 0


def keras_3_note(
    err: BaseException, modules: Mapping[str, Any], keras: KerasChoice
) -> str | None:
    """After a script failed between workers in Keras 3: the likely cause, which its
    traceback (deep in Keras, "unsupported type PerReplica") does not say. `modules`:
    sys.modules. None unless Keras 3 is loaded and the error came from it: raised in its
    code, or a missing attribute of one of its objects (`metric.reset_states()`)."""
    if not keras_3_loaded(modules) or not _raised_by_keras_3(err, modules["keras"]):
        return None
    if keras.version == "2":
        return (
            f"mgpu run: note: the script imported Keras 3 (`import keras`): "
            f"{MULTI_WORKER_ISSUE}.\n  Fix: use `tf.keras` (Keras 2 here: KERAS=auto chooses "
            "it between workers), or `import tf_keras as keras`."
        )
    return (
        f"mgpu run: note: tf.keras is Keras 3 here ({keras.reason}): {MULTI_WORKER_ISSUE}."
        "\n  Fix: KERAS=auto (or 2) with tf-keras installed, and `tf.keras` or "
        "`import tf_keras as keras` in the script."
    )


def _raised_by_keras_3(err: BaseException, keras: Any) -> bool:
    package = os.path.dirname(os.path.abspath(getattr(keras, "__file__", None) or "/-"))
    tb: TracebackType | None = err.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(package + os.sep):
            return True
        tb = tb.tb_next
    owner = type(getattr(err, "obj", None)).__module__ if isinstance(err, AttributeError) else ""
    return owner == "keras" or owner.startswith("keras.")


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _print_user_traceback(err: BaseException) -> None:
    """The traceback from the script's first frame: mgpu's and runpy's frames are left out,
    since the error is in the user's code."""
    tb: TracebackType | None = err.__traceback__
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}
    def is_ours(filename: str) -> bool:
        # runpy may be frozen into the interpreter: its frames are "<frozen runpy>".
        return filename == "<frozen runpy>" or os.path.abspath(filename) in ours

    while tb is not None and is_ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    # Python's excepthook prints the exception's own __traceback__, not the one passed.
    err.__traceback__ = tb
    sys.stderr.flush()
    try:
        sys.excepthook(type(err), err, tb)
    except Exception:
        traceback.print_exception(type(err), err, tb)
    sys.stderr.flush()
