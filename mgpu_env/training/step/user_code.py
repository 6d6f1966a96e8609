"""Your model in the packaged loop, and how any hook of yours is imported.

The model is `MODEL=package.module:function`; hooks are imported by `import_hook` (the
DATASET= loader's too, in `training.input.data.loader`).

The contract (also in docs/your-code.md, "Hooks"):

- **MODEL** `build(input_shape, num_classes)`: `input_shape` is one sample's shape, a tuple
  such as `(784,)`; returns an **uncompiled** `keras.Model` whose input takes that shape and
  whose output is `(batch, num_classes)` class **probabilities** (end with a softmax; under
  mixed precision make it `dtype="float32"`). mgpu calls it inside the strategy's scope,
  after the precision policy and `keras.utils.set_random_seed(SEED)`, and trains it with
  its own optimizer (Adam, LEARNING_RATE), loss (sparse categorical cross-entropy) and
  step; `model.keras` is this model.

Modules are imported like `python -m` does: from the working folder first, then
`PYTHONPATH` and the installed packages. Every mistake is a ConfigError (exit 2) that says
what was expected.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from mgpu_env.config.errors import ConfigError
from mgpu_env.tfprobes.tfimport import import_tensorflow

MODEL_CONTRACT = (
    "build(input_shape, num_classes) returning an uncompiled keras.Model that takes "
    "input_shape and outputs (batch, num_classes) probabilities"
)


def _ensure_working_folder_on_path() -> None:
    # `python -m` puts the working folder first on sys.path; the `mgpu` console script puts
    # its own bin folder there instead, so a hook next to the user's code would not import.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def import_hook(spec: str, setting: str, contract: str) -> Callable[..., Any]:
    """The function `package.module:function` names. Raises ConfigError (exit 2)."""
    module_name, _, function_name = spec.partition(":")
    where = f"{setting}={spec}"
    _ensure_working_folder_on_path()
    # A hook module's top-level `import keras` imports TensorFlow, whose C++ start-up lines
    # would reach stderr: TensorFlow comes first, quietly (a run with a hook imports it
    # anyway: to build the model, or to prepare the devices before a loader runs).
    import_tensorflow()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigError(
                f"{where}: there is no module {missing!r} (looked in the working folder "
                f"{os.getcwd()}, PYTHONPATH and the installed packages).\n"
                f"  Fix: run from the folder that holds {module_name.split('.')[0]}, or add "
                f"that folder to PYTHONPATH."
            ) from None
        raise ConfigError(
            f"{where}: importing {module_name} failed: it imports {missing!r}, which is not "
            f"installed.\n  Fix: install it, or remove the import."
        ) from None
    except Exception as err:
        raise ConfigError(
            f"{where}: importing {module_name} raised {type(err).__name__}: {err}\n"
            "  Fix: the error is in that module (run with --debug for the traceback)."
        ) from err
    function = getattr(module, function_name, None)
    if function is None:
        public = sorted(
            name for name, value in vars(module).items()
            if callable(value) and not name.startswith("_")
            and getattr(value, "__module__", None) == module.__name__
        )
        defined = f" It defines: {', '.join(public)}." if public else ""
        raise ConfigError(
            f"{where}: {module_name} has no {function_name!r}.{defined}\n"
            f"  Expected: {contract}."
        )
    if not callable(function):
        raise ConfigError(
            f"{where}: {module_name}.{function_name} is a {type(function).__name__}, not a "
            f"function.\n  Expected: {contract}."
        )
    return function  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------- MODEL


def build_model(
    spec: str, input_shape: tuple[int, ...], num_classes: int, *, setting: str = "MODEL"
) -> Any:
    """Call the user's builder and check what it returns against the data (ConfigError).

    Call inside the strategy's scope: a model that is not built yet is built here, on one
    zero sample, which also proves it takes `input_shape` and gives `num_classes` outputs.
    """
    from mgpu_env.runtime.keras import tensorflow_keras

    keras = tensorflow_keras()

    build = import_hook(spec, setting, MODEL_CONTRACT)
    where = f"{setting}={spec}"
    try:
        model = build(tuple(input_shape), int(num_classes))
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(
            f"{where}: build{(tuple(input_shape), int(num_classes))} raised "
            f"{type(err).__name__}: {err}\n  Expected: {MODEL_CONTRACT} "
            "(run with --debug for the traceback)."
        ) from err
    if not isinstance(model, keras.Model):
        raise ConfigError(
            f"{where}: build() returned {type(model).__name__}, not a keras.Model.\n"
            f"  Expected: {MODEL_CONTRACT}."
        )
    try:
        output = model(np.zeros((1, *input_shape), dtype=np.float32), training=False)
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ConfigError(
            f"{where}: the model does not take the data's samples of shape "
            f"{tuple(input_shape)} ({type(err).__name__}: {first}).\n"
            f"  Fix: make its input keras.Input(shape=input_shape), as build() is given."
        ) from None
    shape = tuple(getattr(output, "shape", ()))
    if len(shape) != 2 or shape[-1] != num_classes:
        raise ConfigError(
            f"{where}: the model outputs shape {shape} for one sample; the data has "
            f"{num_classes} classes, so expected (1, {num_classes}).\n"
            "  Fix: end the model with Dense(num_classes) and a softmax."
        )
    return model


def built_note(spec: str, model: Any, num_classes: int, *, setting: str = "MODEL") -> str:
    """What the summary says of the user's model once `build_model` built it and it passed
    its checks (`training.step.memprobe` builds it on the CPU, in a child, before the run)."""
    return (
        f"{setting}={spec} was built on the CPU for this check: {model.count_params():,} "
        f"parameters, outputs (batch, {num_classes}) for the data's {num_classes} classes"
    )
