"""What the script's run did, observed at the points where it happens.

`strategy_watch` sees strategies being built; a strategy built is not one that trained (a
script may train under its first MirroredStrategy and then build three more to compare).
So `observe` hooks the few places every training step passes through, each the lightest
spot that is certain to run and cheap to pass (a set lookup after the first time):

- `StrategyBase.run` (and a subclass's own `run`, as TPUStrategy's): Keras 3's and tf_keras'
  `fit`/`evaluate`/`predict` call `distribute_strategy.run` once per step function, a custom
  loop calls it itself. Inside a `tf.function` it runs once, at the trace; outside a scope,
  Keras calls it on TensorFlow's default strategy, so that is seen too;
- `experimental_distribute_dataset`/`distribute_datasets_from_function`: a strategy's data;
- `DTensorDevice._register_mesh`: every tensor or variable laid out on a DTensor mesh
  (`pack`, `call_with_layout`, `DVariable`) registers its mesh there first;
- `GradientTape.gradient`, its first call: what a step differentiated, in which dtypes, and
  on which mesh (a DVariable's layout): the step of a model without Keras layers;
- Keras' `Layer.__call__` (Keras 3 and tf_keras), each layer's first call on real tensors
  (not the symbolic call of a functional model's construction): its compute dtype;
- the calls that change Keras' global policy (`set_global_policy`/`set_dtype_policy`,
  `clear_session`, `set_floatx`, under every name Keras exports them): where the script did
  it, and the policy before and after.

Each wrapper keeps the wrapped function's module name (`functools.wraps`), so AutoGraph
calls it unconverted as it calls TensorFlow's and Keras' own, and never changes an argument
or a result. The records are read by `what_ran.py` after the script.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import sysconfig
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from mgpu_env.launcher.run_watch import eager_run_done, step_seen
from mgpu_env.launcher.strategy_watch import BuiltStrategy, describe_strategy, first_step

# Keras' entry points whose steps call strategy.run: named as the script calls them.
KERAS_ENTRIES = frozenset({
    "fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch",
    "fit_generator", "evaluate_generator", "predict_generator",
})
# Strategy methods that distribute data (no step yet).
DATA_METHODS = ("experimental_distribute_dataset", "distribute_datasets_from_function")
# Keras' functions that change its global policy, by every name the packages export them.
POLICY_SETTERS = ("set_global_policy", "set_dtype_policy", "clear_session", "set_floatx")
_MARK = "_mgpu_observed"


@dataclass(frozen=True)
class Use:
    """A strategy's first step (or first distributed data): how and where the script did it."""

    strategy: BuiltStrategy | None  # None: TensorFlow's default strategy (no scope)
    how: str  # "model.fit", "strategy.run", "experimental_distribute_dataset"
    where: str  # "train.py:40" ("" when no frame of the script's was found)
    step: bool  # False: only data was distributed


@dataclass(frozen=True)
class MeshUse:
    """A DTensor mesh something was laid out on first."""

    dims: str  # "batch=8"
    devices: tuple[str, ...]  # short names: CPU:0
    where: str


@dataclass(frozen=True)
class Gradient:
    """The first `tape.gradient` of the run: the dtypes of what it differentiated."""

    target_dtypes: tuple[str, ...]
    source_dtypes: tuple[str, ...]
    mesh: str  # the mesh of the variables ("batch=8"), "" when not DTensor
    where: str


@dataclass(frozen=True)
class PolicyChange:
    """A call of the script's that changed Keras' global policy."""

    call: str  # "clear_session()"
    keras: str  # "Keras 3", "tf_keras"
    where: str
    before: str
    after: str


@dataclass
class Observed:
    """Everything seen while the script ran, in order."""

    uses: list[Use] = field(default_factory=list)
    meshes: list[MeshUse] = field(default_factory=list)
    gradient: Gradient | None = None
    # (compute dtype, policy name) -> layers; and the first layer of each, "Dense 'dense_1'"
    layers: Counter[tuple[str, str]] = field(default_factory=Counter)
    first_layer: dict[tuple[str, str], str] = field(default_factory=dict)
    policy_changes: list[PolicyChange] = field(default_factory=list)

    def computed(self) -> bool:
        """Whether a step ran: a strategy's `run` (Keras' too), or a gradient (a loop with no
        strategy, a mesh's). A Keras layer's call alone is not one: Keras 3 calls its layers
        on graph tensors to build a model before `fit`'s first step, which may then fail."""
        return any(use.step for use in self.uses) or self.gradient is not None


_OBSERVED = Observed()
_STRATEGIES: dict[int, Any] = {}  # id -> strategy: kept alive, so an id is never reused
_STEPPED: set[int] = set()
_LAYERS: set[int] = set()  # ids of layers seen computing (a freed layer's id may recur)


def observed() -> Observed:
    """What this process's script has done so far (since `observe`)."""
    return _OBSERVED


def _reset() -> None:
    """Forget what was observed (tests)."""
    global _OBSERVED
    _OBSERVED = Observed()
    _STRATEGIES.clear()
    _STEPPED.clear()
    _LAYERS.clear()


# --------------------------------------------------------------------------- call sites

def _library_folders() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    folders = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders.add(str(Path(__file__).resolve().parents[1]))  # mgpu_env
    return tuple(os.path.realpath(folder) + os.sep for folder in folders)


LIBRARIES = _library_folders()


def _is_library(filename: str) -> bool:
    if filename.startswith("<") or "__autograph_generated_file" in filename:
        return True
    return os.path.realpath(filename).startswith(LIBRARIES)


def call_site(frame: FrameType | None, api: str) -> tuple[str, str]:
    """(how, where): the script's frame nearest to `frame` ("train.py:40"), and the Keras
    entry the script called there (`model.fit`), else `api`."""
    how = api
    while frame is not None and _is_library(frame.f_code.co_filename):
        if frame.f_code.co_name in KERAS_ENTRIES:
            how = f"model.{frame.f_code.co_name}"  # the outermost wins: fit over evaluate
        frame = frame.f_back
    if frame is None:
        return how, ""
    return how, f"{shown_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def shown_path(path: str) -> str:
    """A script's path as a note shows it: relative to the working folder when inside it."""
    relative = os.path.relpath(path) if os.path.isabs(path) else path
    return path if relative.startswith("..") else relative


# ------------------------------------------------------------------------------ hooks

def _wrap(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> None:
    original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
    if original is None or getattr(original, _MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _MARK, True)
    setattr(owner, name, wrapper)


def _strategy_used(strategy: Any, api: str, step: bool) -> None:
    key = id(strategy)
    if key in _STEPPED or (not step and key in _STRATEGIES):
        return
    _STRATEGIES[key] = strategy
    if step:
        _STEPPED.add(key)
    how, where = call_site(sys._getframe(3), api)  # _quietly, the wrapper, its caller
    built = None if type(strategy).__name__ == "_DefaultDistributionStrategy" else \
        describe_strategy(strategy)
    _OBSERVED.uses.append(Use(built, how, where, step))
    if step:
        first_step(built, how, where)


def _run_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if id(self) not in _STEPPED:
            _quietly(_strategy_used, self, "strategy.run", True)
        step_seen()  # every call: each step function's trace marks it a step
        result = original(self, *args, **kwargs)
        eager_run_done()
        return result
    return run


def _data_wrapper(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def distribute(self: Any, *args: Any, **kwargs: Any) -> Any:
            if id(self) not in _STRATEGIES:
                _quietly(_strategy_used, self, name, False)
            return original(self, *args, **kwargs)
        return distribute
    return make


def _quietly(record: Callable[..., None], *args: Any) -> None:
    """An observation that fails is lost, never the script's step."""
    with contextlib.suppress(Exception):
        record(*args)


def watch_strategy_class(cls: type) -> None:
    """Hook a strategy class that has a `run` of its own (TPUStrategy); `strategy_watch`
    calls it for each strategy built."""
    if "run" in cls.__dict__:
        _wrap(cls, "run", _run_wrapper)


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    direct: list[type] = cls.__subclasses__()
    for sub in direct:
        found.extend([sub, *_subclasses(sub)])
    return found


def _short(device: str) -> str:
    return str(device).rsplit("device:", 1)[-1]


def _mesh_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def _register_mesh(self: Any, mesh: Any) -> Any:
        try:
            if mesh not in self._meshes:
                dims = ",".join(f"{name}={size}" for name, size in
                                zip(mesh.dim_names, mesh.shape(), strict=True))
                devices = tuple(_short(device) for device in mesh.local_devices())
                _, where = call_site(sys._getframe(1), "")
                _OBSERVED.meshes.append(MeshUse(dims, devices, where))
        except Exception:  # a mesh this cannot read: the script's run is what matters
            pass
        return original(self, mesh)
    return _register_mesh


def _dtypes(values: Any) -> tuple[str, ...]:
    import tensorflow as tf

    return tuple(str(getattr(getattr(value, "dtype", None), "name", "?"))
                 for value in tf.nest.flatten(values) if value is not None)


def _mesh_of(values: Any) -> str:
    import tensorflow as tf

    for value in tf.nest.flatten(values):
        mesh = getattr(getattr(value, "layout", None), "mesh", None)
        if mesh is not None and hasattr(mesh, "dim_names"):
            return ",".join(f"{name}={size}" for name, size in
                            zip(mesh.dim_names, mesh.shape(), strict=True))
    return ""


def _gradient_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def gradient(self: Any, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        if _OBSERVED.gradient is None:
            try:
                _, where = call_site(sys._getframe(1), "tape.gradient")
                _OBSERVED.gradient = Gradient(_dtypes(target), _dtypes(sources),
                                              _mesh_of(sources), where)
            except Exception:
                pass
        return original(self, target, sources, *args, **kwargs)
    return gradient


def _symbolic(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a layer call builds a functional model (KerasTensors) instead of computing."""
    first = args[0] if args else next(iter(kwargs.values()), None)
    for _ in range(3):  # a list or dict of inputs: its first
        if isinstance(first, (list, tuple)) and first:
            first = first[0]
        elif isinstance(first, dict) and first:
            first = next(iter(first.values()))
    return type(first).__name__ == "KerasTensor"


def _layer_wrapper(model: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            if id(self) not in _LAYERS and not _symbolic(args, kwargs):
                _LAYERS.add(id(self))
                if not isinstance(self, model):  # a model only runs its layers
                    _quietly(_layer_computed, self)
            return original(self, *args, **kwargs)
        return __call__
    return make


def _layer_computed(layer: Any) -> None:
    try:
        key = (str(layer.compute_dtype), str(layer.dtype_policy.name))
    except Exception:
        return
    _OBSERVED.layers[key] += 1
    _OBSERVED.first_layer.setdefault(key, f"{type(layer).__name__} '{layer.name}'")


def _policy_wrapper(keras: str, policy: Callable[[], Any]
                    ) -> Callable[[Callable[..., Any], str], Callable[..., Any]]:
    def make(original: Callable[..., Any], called: str) -> Callable[..., Any]:
        def setter(*args: Any, **kwargs: Any) -> Any:
            if _READING_POLICY:  # reading the policy may set it (Keras 3's dtype_policy())
                return original(*args, **kwargs)
            before = _policy_name(policy)
            result = original(*args, **kwargs)
            after = _policy_name(policy)
            if after != before:
                shown = ", ".join([*(repr(a) for a in args),
                                   *(f"{k}={v!r}" for k, v in kwargs.items())])
                _, where = call_site(sys._getframe(1), "")
                _OBSERVED.policy_changes.append(PolicyChange(
                    f"{called}({shown})", keras, where, before, after))
            return result
        return setter
    return make


_READING_POLICY: list[bool] = []


def _policy_name(policy: Callable[[], Any]) -> str:
    _READING_POLICY.append(True)
    try:
        return str(policy().name)
    except Exception:
        return "?"
    finally:
        _READING_POLICY.pop()


def _wrap_everywhere(package: str, originals: list[Any],
                     make: Callable[[Callable[..., Any], str], Callable[..., Any]]) -> None:
    """Replace each function in `originals` under every public name a loaded module of
    `package` exports it (keras.backend.clear_session is keras.utils.clear_session is
    tf.keras.backend.clear_session). Keras' own modules (`.src.`) keep theirs: Keras calls
    them itself (Keras 3's `dtype_policy()` sets the policy it reads)."""
    wrappers: dict[tuple[int, str], Any] = {}  # one per function and name, which it says
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(package + ".")) or (
                ".src." in name + "."):
            continue
        for attribute in POLICY_SETTERS:
            value = module.__dict__.get(attribute) if hasattr(module, "__dict__") else None
            if value is None or not any(value is original for original in originals):
                continue
            key = (id(value), attribute)
            if key not in wrappers:
                wrapper = functools.wraps(value)(make(value, attribute))
                setattr(wrapper, _MARK, True)
                wrappers[key] = wrapper
            setattr(module, attribute, wrappers[key])


def observe() -> None:
    """Install the hooks (idempotent; imports TensorFlow). Call again after a Keras package
    was imported, to watch its layers and policy too."""
    from tensorflow.python.distribute import distribute_lib
    from tensorflow.python.eager import backprop

    _wrap(distribute_lib.StrategyBase, "run", _run_wrapper)
    for cls in _subclasses(distribute_lib.StrategyBase):
        watch_strategy_class(cls)
    for name in DATA_METHODS:
        _wrap(distribute_lib.StrategyBase, name, _data_wrapper(name))
    _wrap(backprop.GradientTape, "gradient", _gradient_wrapper)
    try:
        from tensorflow.dtensor.python import dtensor_device
    except ImportError:  # a TensorFlow without DTensor
        pass
    else:
        _wrap(dtensor_device.DTensorDevice, "_register_mesh", _mesh_wrapper)
    _observe_keras()


def _observe_keras() -> None:
    modules = sys.modules
    if "keras.src.layers.layer" in modules and "keras.src.models.model" in modules:
        from keras.src.backend import config
        from keras.src.backend.common import global_state
        from keras.src.dtype_policies import dtype_policy
        from keras.src.layers.layer import Layer
        from keras.src.models.model import Model

        _wrap(Layer, "__call__", _layer_wrapper(Model))
        _wrap_everywhere("keras", [dtype_policy.set_dtype_policy, global_state.clear_session,
                                   config.set_floatx],
                         _policy_wrapper("Keras 3", dtype_policy.dtype_policy))
    if "tf_keras.src.engine.base_layer" in modules and "tf_keras.src.engine.training" in modules:
        from tf_keras.src import backend, backend_config
        from tf_keras.src.engine.base_layer import Layer as Layer2
        from tf_keras.src.engine.training import Model as Model2
        from tf_keras.src.mixed_precision import policy

        _wrap(Layer2, "__call__", _layer_wrapper(Model2))
        _wrap_everywhere("tf_keras", [policy.set_global_policy, backend.clear_session,
                                      backend_config.set_floatx],
                         _policy_wrapper("tf_keras", policy.global_policy))
