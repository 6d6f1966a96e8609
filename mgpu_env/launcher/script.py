"""`mgpu run`: your script, or `-m package.module`, with every decision `mgpu train` makes.

    target = resolve_target(["train.py", "--lr", "0.1"], module=False)  # ConfigError: exit 2
    scan = scan_target(target)     # its source: Keras 2 era code, a custom loop (~ms)
    runtime = build_runtime(resolved, command="run", keras_2_code=scan.keras_2_evidence())
    runtime.apply()                # GPUS, TF_CONFIG, TF_USE_LEGACY_KERAS: before TensorFlow
    prepare(runtime)        # pre-flight, device split, precision policy, MirroredStrategy()
    code = run_target(target, runtime)         # the script's exit code, then mgpu's notes

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
  (tf_keras): between workers, where Keras 3 cannot train, and for a script whose source
  uses what only Keras 2 has (`launcher/source_scan.py`);
- VIRTUAL_DEVICES and MIXED_PRECISION: `Execution.prepare_tensorflow()` splits the devices
  and sets the global policy of the Keras `tf.keras` is before the script's first line, so
  its first layer takes the policy;
- the strategy: TensorFlow's `tf.distribute.MirroredStrategy()` with no arguments takes
  every GPU, logical ones included, or when there is none every logical CPU device
  (TensorFlow 2.21, `mirrored_strategy.all_local_devices`), and picks its all-reduce itself
  (NCCL on GPUs, which fails between logical GPUs that share one). Here its defaults become
  the planned devices and all-reduce (`_plan_mirrored_defaults`), checked against the
  devices that exist when it is built (a script may split the devices itself: then those
  are used, and a note says so). Arguments the script passes win.
- what ran: each strategy as it is built (`launcher/strategy_watch.py`), and what the
  script's steps really ran on and computed in, observed while it runs
  (`launcher/run_observer.py`) and said after it (`launcher/what_ran.py`), with the fix
  where it differs from the plan, and nothing after a failure before the first step.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import shlex
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
from mgpu_env.launcher.run_observer import observe
from mgpu_env.launcher.run_watch import hook_tensorflow, script_running
from mgpu_env.launcher.source_scan import ScriptScan, error_note, scan_script, script_roots
from mgpu_env.launcher.strategy_watch import PlannedReplicas, planned_replicas, watch
from mgpu_env.launcher.what_ran import ran_notes, unscaled_loop_warning
from mgpu_env.runtime import Runtime
from mgpu_env.runtime.keras import (
    MULTI_WORKER_ISSUE,
    KerasChoice,
    keras_2_error,
    keras_3_loaded,
)
from mgpu_env.runtime.precision import MIXED_FLOAT16
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


def scan_target(target: Target) -> ScriptScan:
    """The target's source and its local modules, read before anything starts
    (`launcher/source_scan.py`): a few milliseconds, and it never fails the run."""
    return scan_script(target.path, script_roots(target.is_module, target.path))


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
    watch(planned(runtime), quiet=runtime.settings.quiet)
    observe()
    hook_tensorflow()  # the stall watch's, when `run_watch.stall_watch` is on
    if runtime.cluster is not None and runtime.keras.version == "2":
        _true_batch_metrics_between_workers()
    api.adopt(runtime, tensorflow_prepared=True)


def planned(runtime: Runtime) -> PlannedReplicas:
    """The replicas the run's settings planned, to hold the script's strategy against."""
    return planned_replicas(runtime.strategy_plan, runtime.replicas, runtime.role.num_workers)


def summary(runtime: Runtime, target: Target, scan: ScriptScan | None = None) -> list[str]:
    """What the script will get, on stderr before it starts (QUIET=1: nothing), so its own
    output on stdout stays its own: the planned devices and precision and why (what ran is
    said after the script, as observed), the Keras (and why, when it is not the default's),
    and what the source scan found."""
    plan = runtime.strategy_plan
    logical = " logical" if runtime.split.logical else ""
    lines = [
        f"mgpu run {target.describe()}: planned {plan.local_replicas} x{logical} "
        f"{runtime.device_type}"
        f", {runtime.replicas} replica(s) ({plan.kind}), precision {runtime.precision.policy}"
        f", all-reduce {plan.cross_device_ops}, tf.keras {runtime.keras.label}"
    ]
    if (cluster := runtime.cluster_line()) is not None:
        lines.append(f"  cluster: {cluster}")
    lines.append(f"  precision: {runtime.precision.reason}")
    if runtime.keras.version == "2" or runtime.settings.keras != "auto":
        lines.append(f"  keras: {runtime.keras.reason}")
    if scan is not None and scan.keras_3_import is None and (why := scan.keras_2_why()):
        lines.append(f"  keras 2 code: {why}")
    lines.extend(f"  note: {note}" for note in runtime.notes)
    if scan is not None:
        lines.extend(f"  note: {note}" for note in scan.notes(runtime.keras.version))
        if (loop := scan.unscaled_custom_loop()) is not None and (
            runtime.precision.policy == MIXED_FLOAT16
        ):
            lines.append(f"  warning: {unscaled_loop_warning(loop.where, 'MIXED_PRECISION')}")
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

    from mgpu_env.runtime.strategy import make_cross_device_ops, mirrored_devices, print_note

    if plan.kind != "mirrored":
        return  # a cluster: the script's MirroredStrategy() stays one worker's, as in TF
    tensorflow_default: Any = tf.distribute.MirroredStrategy
    if getattr(tensorflow_default, "_mgpu_plan", None) is not None:
        tensorflow_default = tensorflow_default.__mro__[1]  # prepared before (tests)

    class MirroredStrategy(tensorflow_default):  # type: ignore[misc, valid-type]
        __doc__ = tensorflow_default.__doc__
        _mgpu_plan = plan

        def __init__(self, devices: Any = None, cross_device_ops: Any = None) -> None:
            self._mgpu_planned_devices = devices is None  # for strategy_watch's fix
            if devices is None:
                planned, changed = mirrored_devices(plan)
                if changed is not None:
                    print_note(changed)
                devices = list(planned)
                if cross_device_ops is None:
                    cross_device_ops = make_cross_device_ops(plan)
            super().__init__(devices, cross_device_ops)

    # Tracebacks and reprs name it as TensorFlow does, not "..<locals>.MirroredStrategy".
    MirroredStrategy.__module__ = tensorflow_default.__module__
    MirroredStrategy.__qualname__ = tensorflow_default.__qualname__
    tf.distribute.MirroredStrategy = MirroredStrategy


def _true_batch_metrics_between_workers() -> None:
    """tf_keras `model.fit` between workers: make the per-batch logs the true values.

    tf_keras reduces what a step returns with `distribute_reduction_method` "auto", which
    under MultiWorkerMirroredStrategy is a SUM over every replica of every worker
    (`training.reduce_per_replica`). The default step returns the metrics' results, already
    the same global value on every replica, so the per-batch logs (the progress bar during
    an epoch, `on_train_batch_end`, `on_test_batch_end`) read N workers times the truth
    (keras-team/keras#16304: accuracy 1.93 on 2 workers). The epoch-end logs and History are
    read from the metrics themselves and were right. Here the default, for a model that
    keeps tf_keras' own train_step and test_step, is "first": one replica's value, which is
    the global one. A model with its own step keeps "auto" (its outputs may be per-replica
    parts meant to be summed), and a value the script sets itself always wins.
    """
    from tf_keras.src.engine import training

    model: Any = training.Model
    if getattr(model, "_mgpu_true_batch_metrics", False):
        return
    declared = model.distribute_reduction_method

    def distribute_reduction_method(self: Any) -> str:
        chosen = self._distribute_reduction_method
        if chosen is not None:
            return str(chosen)
        own_steps = (type(self).train_step is model.train_step
                     and type(self).test_step is model.test_step)
        return "first" if own_steps and training._collective_all_reduce_multi_worker(
            self.distribute_strategy) else "auto"

    model.distribute_reduction_method = property(
        distribute_reduction_method, declared.fset, doc=declared.__doc__)
    model._mgpu_true_batch_metrics = True


def run_target(
    target: Target, runtime: Runtime | None = None, scan: ScriptScan | None = None
) -> int:
    """Run the target as `__main__` with `sys.argv` = [SCRIPT, *ARGS]; its exit code.

    `sys.exit(n)` gives n (None: 0; a message: printed, 1). An exception prints the
    script's traceback (from its own first frame, through `sys.excepthook` as Python
    would) and gives 1; Ctrl-C gives 130. Everything else the script does is its own.
    With the run's `runtime` (and `scan`), mgpu's notes follow on stderr: what ran, as
    observed (`ran_notes`: none after a failure before any step), and after an exception
    that Keras 2 code meets in Keras 3, the fix (`keras_note`), always the last line.
    """
    sys.argv = target.argv
    if target.is_module:
        _working_folder_first()
    else:
        # As `python script.py`: the script's folder first on sys.path.
        sys.path.insert(0, str(Path(target.name).resolve().parent))
    try:
        with script_running():  # the stall watch: the script's own code, then disarmed
            if target.is_module:
                runpy.run_module(target.name, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target.name, run_name="__main__")
    except SystemExit as stop:
        code = _exit_status(stop.code)
        _end_notes(runtime, scan, None, failed=code != 0)
        return code
    except KeyboardInterrupt as err:
        _print_user_traceback(err)
        return EXIT_INTERRUPTED
    except BaseException as err:  # the script's own error: its traceback, as Python shows it
        _print_user_traceback(err)
        _end_notes(runtime, scan, err, target)
        return 1
    _end_notes(runtime, scan, None)
    return 0


def _end_notes(runtime: Runtime | None, scan: ScriptScan | None, err: BaseException | None,
               target: Target | None = None, *, failed: bool = False) -> None:
    if runtime is None:
        return
    notes: list[str | None] = [*ran_notes(runtime, scan, failed=failed or err is not None)]
    if err is not None and target is not None:
        cluster = runtime.cluster is not None  # (a TensorFlow change: KERAS=2 won't help)
        notes.append(error_note(err) or keras_note(ScriptFailure(err, sys.modules),
                                                   runtime.keras, target,
                                                   cluster=cluster, scan=scan))
    for note in notes:
        if note is not None:
            print(note, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ScriptFailure:
    """A script's error with the modules its process had loaded when it was raised
    (sys.modules): whether Keras 3 raised it is read from both."""

    err: BaseException
    modules: Mapping[str, Any]


def keras_note(
    failure: ScriptFailure, keras: KerasChoice, target: Target,
    *, cluster: bool, scan: ScriptScan | None = None,
) -> str | None:
    """After a script failed: what its traceback does not say when the cause is Keras 2
    code in Keras 3, and the one change that fixes it.

    - tf.keras is Keras 3, and the error is one Keras 2 code meets there (`keras_2_error`),
      or, between workers, any error raised in Keras 3 (keras-team/keras#20585): rerun with
      KERAS=2, the command spelled out;
    - tf.keras is Keras 3 because KERAS=auto saw no Keras 2 code (`keras.by_default`), and
      the `scan` says the script is `tf.keras` code: whatever the error, rerun with KERAS=2
      (Keras 2 code the scan could not see is the likely cause), unless no Keras can have
      caused it (`not_by_keras`: its own file, another package missing);
    - tf.keras is Keras 2 but the script imported Keras 3 itself (`import keras`) and the
      error came from it: change that import.
    None otherwise, and for a script that imports Keras 3 itself (KERAS=2 leaves it)."""
    err, modules = failure.err, failure.modules
    cause = keras_2_error(err)
    raised_in_keras_3 = keras_3_loaded(modules) and _raised_by_keras_3(err, modules["keras"])
    if keras.version == "2":
        if not raised_in_keras_3:
            return None
        why = f": {MULTI_WORKER_ISSUE}" if cluster else (f" ({cause})" if cause else "")
        return (
            f"mgpu run: note: tf.keras is Keras 2 here, but the script imported Keras 3 "
            f"(`import keras`){why}.\n  Fix: use `tf.keras`, or `import tf_keras as keras`."
        )
    if scan is not None and scan.keras_3_import is not None:
        return None  # its `keras` is Keras 3 under KERAS=2 too: the start summary said so
    if cause is None and cluster and raised_in_keras_3:
        cause = MULTI_WORKER_ISSUE
    words = ["mgpu", "run", *(["-m"] if target.is_module else []), target.name, *target.args]
    rerun = f"Fix: rerun with Keras 2 (tf_keras): KERAS=2 {shlex.join(words)}"
    if cause is not None:
        return (f"mgpu run: note: this is Keras 2 code meeting Keras 3 ({cause}); tf.keras "
                f"is Keras 3 here ({keras.reason}). {rerun}")
    if not keras.by_default or scan is None or scan.tf_keras_use is None or (
            not_by_keras(err)):
        return None
    return (
        f"mgpu run: note: the script is tf.keras code ({scan.tf_keras_use.describe()}) and "
        f"failed under Keras 3, which KERAS=auto chose; tf.keras code written before "
        f"TensorFlow 2.16 is Keras 2 code, which fails in Keras 3 in ways its source does "
        f"not show. {rerun}"
    )


# The packages a failure must pass through for Keras to have caused it.
KERAS_PACKAGES = ("tensorflow", "keras", "tf_keras")


def not_by_keras(err: BaseException) -> bool:
    """A failure no Keras can have caused, so rerunning under another is no fix: a module
    missing that is not TensorFlow's or Keras' (`import tensorflow_addons`), or a file or
    folder the script's own code could not open (an OSError with no TensorFlow or Keras
    frame in its traceback)."""
    if isinstance(err, ImportError):
        return bool(err.name) and str(err.name).split(".")[0] not in KERAS_PACKAGES
    if not isinstance(err, OSError):
        return False
    files = [getattr(sys.modules.get(name), "__file__", None) for name in KERAS_PACKAGES]
    folders = tuple(os.path.dirname(os.path.abspath(file)) + os.sep for file in files if file)
    tb: TracebackType | None = err.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(folders):
            return False
        tb = tb.tb_next
    return True


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
