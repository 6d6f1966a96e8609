"""Which Keras `tf.keras` is: Keras 3, or Keras 2 (the `tf_keras` package).

Keras 3 cannot train with `MultiWorkerMirroredStrategy` (keras-team/keras#20585, open):
`model.fit` fails with "Attempt to convert a value (PerReplica:{...}) with an unsupported
type", and its metrics lack the `reset_states` TensorFlow's custom-loop tutorial calls.
Keras 2 (`tf_keras`) still can. TensorFlow routes `tf.keras` to `tf_keras` when
`TF_USE_LEGACY_KERAS` is set before TensorFlow is imported, so the choice is made here,
with the other decisions, and travels as that variable in the `Execution`'s environment.

Code written for Keras 2 (`tf.keras` before TensorFlow 2.16) meets Keras 3 on one machine
too: `metric.reset_states()`, `tf.keras.optimizers.legacy`, `get_scaled_loss`. `mgpu run`
reads the script first (`launcher/source_scan.py`); what only Keras 2 has makes KERAS=auto
choose tf_keras, with the API and its file:line in the reason. What the scan cannot see,
the failure does: a `tf.keras` script that fails under the Keras 3 KERAS=auto chose ends with
KERAS=2 and the command, whatever the error (`KerasChoice.by_default`), and `keras_2_error`
sharpens that line when it recognises the error.

`choose_keras` is pure (the request, the run's shape and three facts in, a decision out);
`tensorflow_keras` is the one way mgpu's own code reaches Keras once TensorFlow has started,
so what mgpu sets (the precision policy, the seed) lands in the Keras the script uses.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mgpu_env.config.errors import ConfigError

KerasVersion = Literal["2", "3"]
KerasRequest = Literal["auto", "3", "2"]
# Who the Keras is for: a user's script (`mgpu run`, or plain `python` with the API), or
# mgpu's own training loop and benchmark, which work with Keras 3 between workers.
Command = Literal["run", "train", "bench"]

LEGACY_VARIABLE = "TF_USE_LEGACY_KERAS"
# The values TensorFlow takes for "on" (tensorflow/__init__.py, python/util/lazy_loader.py);
# anything else, "0" included, leaves tf.keras on Keras 3.
LEGACY_ON = ("true", "True", "1")
TF_KERAS_PIN = "tf-keras==2.21.*"
MULTI_WORKER_ISSUE = (
    "Keras 3 cannot train with MultiWorkerMirroredStrategy (keras-team/keras#20585)"
)


@dataclass(frozen=True)
class KerasChoice:
    """The Keras `tf.keras` is for a run, why, and what the user should know about it."""

    version: KerasVersion
    reason: str
    notes: tuple[str, ...] = ()
    # Keras 3 because KERAS=auto found no reason for Keras 2 (nobody asked for Keras 3, and
    # tf_keras is there): a tf.keras script that then fails may be Keras 2 code the scan
    # did not see, and KERAS=2 is worth a try, whatever the error.
    by_default: bool = False

    @property
    def label(self) -> str:
        """"Keras 2 (tf_keras)" or "Keras 3", for summaries."""
        return "Keras 2 (tf_keras)" if self.version == "2" else "Keras 3"

    def environment(self, user_legacy: str | None) -> dict[str, str]:
        """The variables that make TensorFlow's `tf.keras` this Keras: TF_USE_LEGACY_KERAS=1
        for Keras 2; for Keras 3, 0 only where the user's own setting would say 1."""
        if self.version == "2":
            return {LEGACY_VARIABLE: "1"}
        return {LEGACY_VARIABLE: "0"} if user_legacy in LEGACY_ON else {}


def tf_keras_installed() -> bool:
    """Whether `tf_keras` can be imported (found, not imported: it would import TensorFlow)."""
    return importlib.util.find_spec("tf_keras") is not None


@dataclass(frozen=True)
class KerasFound:
    """What, besides KERAS, decides the Keras: what the user, the machine and the script
    already have.

    `user_legacy`: TF_USE_LEGACY_KERAS as the user set it (environment, else the settings
    file), None when unset; `tf_keras_available`: `tf_keras_installed()`; `keras_2_code`:
    what in the script only Keras 2 has (`ScriptScan.keras_2_evidence()`,
    "`x.reset_states()` at train.py:40"), None when nothing.
    """

    user_legacy: str | None
    tf_keras_available: bool
    keras_2_code: str | None = None


def choose_keras(
    request: KerasRequest, found: KerasFound, *, multi_worker: bool, command: Command,
) -> KerasChoice:
    """Turn KERAS (auto, 3, 2) into the Keras `tf.keras` will be.

    `multi_worker`: the run is a cluster; `command`: whose code uses Keras; `found`: what
    the user, the machine and the script have (`KerasFound`). An explicit KERAS wins over
    TF_USE_LEGACY_KERAS; with KERAS=auto the user's TF_USE_LEGACY_KERAS is respected, then
    Keras 2 code gets Keras 2.
    Raises ConfigError (exit 2) when Keras 2 is asked for and `tf_keras` is not installed.
    """
    multi_worker_script = multi_worker and command == "run"
    user_legacy, tf_keras_available = found.user_legacy, found.tf_keras_available
    keras_2_code = found.keras_2_code
    if request == "2":
        return _keras_2_asked(user_legacy, tf_keras_available)
    if request == "3":
        return _keras_3_asked(user_legacy, command, multi_worker_script, keras_2_code)
    if user_legacy is not None:
        return _follow_user_legacy(user_legacy, multi_worker_script, tf_keras_available)
    return _auto_keras(command, multi_worker_script, tf_keras_available, keras_2_code)


def _keras_2_asked(user_legacy: str | None, tf_keras_available: bool) -> KerasChoice:
    """KERAS=2: it wins over the user's TF_USE_LEGACY_KERAS, said in a note."""
    _require_tf_keras("KERAS=2", "or set KERAS=3", tf_keras_available)
    overridden = user_legacy is not None and user_legacy not in LEGACY_ON
    return KerasChoice(
        "2", "KERAS=2: tf.keras is tf_keras",
        (f"KERAS=2 overrides {LEGACY_VARIABLE}={user_legacy}",) if overridden else ())


def _keras_3_asked(
    user_legacy: str | None, command: Command, multi_worker_script: bool,
    keras_2_code: str | None,
) -> KerasChoice:
    """KERAS=3: it wins, with a note for each reason Keras 2 would have served better."""
    notes: list[str] = (
        [f"KERAS=3 overrides {LEGACY_VARIABLE}={user_legacy}"]
        if user_legacy in LEGACY_ON else [])
    if keras_2_code is not None and command == "run":
        notes.append(f"KERAS=3, but the script uses what only Keras 2 has "
                     f"({keras_2_code}); KERAS=auto would give it tf_keras")
    if multi_worker_script:
        notes.append(f"KERAS=3 between workers: {MULTI_WORKER_ISSUE}; "
                     "KERAS=auto gives the script Keras 2")
    return KerasChoice("3", "KERAS=3", tuple(notes))


def _follow_user_legacy(
    user_legacy: str, multi_worker_script: bool, tf_keras_available: bool
) -> KerasChoice:
    """KERAS=auto with the user's own TF_USE_LEGACY_KERAS: it is respected."""
    if user_legacy in LEGACY_ON:
        _require_tf_keras(f"{LEGACY_VARIABLE}={user_legacy} (set by you)",
                          f"or unset {LEGACY_VARIABLE}", tf_keras_available)
        return KerasChoice(
            "2", f"KERAS=auto follows your {LEGACY_VARIABLE}={user_legacy}: tf_keras")
    off_notes = ((f"{LEGACY_VARIABLE}={user_legacy} between workers: {MULTI_WORKER_ISSUE}; "
                  f"unset it so KERAS=auto gives the script Keras 2",)
                 if multi_worker_script else ())
    return KerasChoice(
        "3", f"KERAS=auto follows your {LEGACY_VARIABLE}={user_legacy}: Keras 3", off_notes)


def _auto_keras(
    command: Command, multi_worker_script: bool, tf_keras_available: bool,
    keras_2_code: str | None,
) -> KerasChoice:
    """KERAS=auto, TF_USE_LEGACY_KERAS unset: Keras 2 for a script between workers or with
    Keras 2 code (when tf_keras is installed), else Keras 3."""
    if multi_worker_script:
        if not tf_keras_available:
            return KerasChoice(
                "3", "KERAS=auto, but tf_keras is not installed: Keras 3",
                (f"{MULTI_WORKER_ISSUE}, and Keras 2 is not installed: a script that trains "
                 f"with Keras fails between workers. Fix: pip install '{TF_KERAS_PIN}'",),
            )
        return KerasChoice(
            "2", f"KERAS=auto between workers: {MULTI_WORKER_ISSUE}, so tf.keras is Keras 2 "
                 "(tf_keras)")
    if keras_2_code is not None and command == "run":
        if not tf_keras_available:
            return KerasChoice(
                "3", "KERAS=auto, but tf_keras is not installed: Keras 3",
                (f"the script uses what only Keras 2 has ({keras_2_code}), and Keras 2 is "
                 f"not installed. Fix: pip install '{TF_KERAS_PIN}'",),
            )
        return KerasChoice(
            "2", f"KERAS=auto: the script uses what only Keras 2 has ({keras_2_code}), so "
                 "tf.keras is Keras 2 (tf_keras); KERAS=3 keeps Keras 3")
    where = "mgpu's own loop" if command != "run" else "one process"
    return KerasChoice("3", f"KERAS=auto: Keras 3 ({where})",
                       by_default=tf_keras_available and command == "run")


def _require_tf_keras(what: str, alternative: str, available: bool) -> None:
    if not available:
        raise ConfigError(
            f"{what} makes tf.keras Keras 2, but the tf_keras package is not installed.\n"
            f"  Valid: KERAS=auto, 3 or 2 (2 needs tf_keras). "
            f"Fix: pip install '{TF_KERAS_PIN}', {alternative}."
        )


def tensorflow_keras() -> Any:
    """The Keras `tf.keras` is in this process: tf_keras under TF_USE_LEGACY_KERAS, else
    Keras 3. mgpu's own code uses it, never `import keras`, so the policy it sets and the
    layers it builds belong to the Keras the user's `tf.keras` code gets. Imports TensorFlow.
    """
    import tensorflow as tf

    return tf.keras


def tensorflow_keras_version() -> KerasVersion:
    """"2" when `tf.keras` is tf_keras, else "3" (loads Keras: after the environment)."""
    name = getattr(tensorflow_keras(), "__name__", "")
    return "2" if name.startswith("tf_keras") else "3"


def keras_3_loaded(modules: Mapping[str, Any]) -> bool:
    """Whether Keras 3 was imported as `keras` (`import keras`): `modules` is sys.modules."""
    keras = modules.get("keras")
    return str(getattr(keras, "__version__", "")).startswith("3")


# Errors Keras 2 code meets in Keras 3, as Keras 3.15 and TensorFlow 2.21 word them, each with
# what in the code causes it. Each one's code runs under tf_keras
# (tests/tensorflow_inprocess/test_keras_choice.py raises every one under Keras 3; the corpus
# in tests/keras2_scripts/ runs the scripts).
KERAS_2_ERRORS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), cause) for pattern, cause in (
        (r"has no attribute 'reset_states'", "Keras 3 metrics have reset_state(), not "
                                             "reset_states()"),
        (r"keras\.optimizers\.legacy` is not supported in Keras 3",
         "keras.optimizers.legacy is Keras 2's"),
        (r"Mixing different tf\.distribute\.Strategy objects",
         "Keras 3 wants the model built and compiled in the same strategy's scope"),
        (r"'str' object has no attribute 'name'",
         "Keras 3 gives dtypes as strings (`x.dtype` is 'float16'), Keras 2 as tf.DType"),
        (r"Only instances of `keras\.Layer` can be added to a Sequential model",
         "a Keras 2 layer (tf_keras, tensorflow_hub) in a Keras 3 model"),
        (r"Argument\(s\) not recognized: \{'lr'", "Keras 3 optimizers take learning_rate=, "
                                                  "not lr="),
        (r"has no attribute '(fit_generator|evaluate_generator|predict_generator|"
         r"get_scaled_loss|get_unscaled_gradients)'", "a Keras 2 method"),
        (r"module '[\w.]*keras[\w.]*' has no attribute 'experimental'",
         "Keras 2's experimental modules"),
        (r"Invalid filepath extension for saving",
         "Keras 3 saves .keras or .h5 files, not Keras 2's SavedModel folders"),
        (r"must end in `\.weights\.h5`", "Keras 3 saves weights to .weights.h5 files, not "
                                         "Keras 2's TensorFlow checkpoints"),
        (r"File format not supported: filepath=", "Keras 3 loads .keras, .h5 and "
                                                  ".weights.h5 files, not Keras 2's formats"),
        (r"A KerasTensor cannot be used as input to a TensorFlow function",
         "Keras 2 let TensorFlow ops take symbolic Keras tensors"),
    )
)


def keras_2_error(err: BaseException) -> str | None:
    """Why `err` looks like Keras 2 code meeting Keras 3 (one of KERAS_2_ERRORS), else None."""
    text = f"{type(err).__name__}: {err}"
    for pattern, cause in KERAS_2_ERRORS:
        if pattern.search(text):
            return cause
    return None
