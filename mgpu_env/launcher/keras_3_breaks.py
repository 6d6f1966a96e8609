"""What Keras 2 code does that Keras 3 refuses, as rules the source scan applies to a call.

Each rule is a fact about the two Keras this image ships (tf_keras 2.21, Keras 3.15), not an
error string: a name Keras 3's `tf.keras` lacks, a keyword its methods lack, a file a save
or a checkpoint writes that Keras 3 will not write. The tables of names and keywords are
the difference between the two packages themselves (tests/processes/test_source_scan.py
compares them with both installed, so a new Keras that adds or drops one fails there, not in a
user's run); the file rules are Keras 3's own checks (`saving_api.save_model`,
`Model.save_weights`, `ModelCheckpoint.__init__`, `saving_api.load_model`), restated on the
path as written.
From keras.io's "Migrating Keras 2 code to multi-backend Keras 3" and keras-team/keras#18467.

Every function here is pure: an `ast` node (and the file's string constants) in, a reason
out, or None when the code is Keras 3's as well or the scan cannot tell (a path in
`argparse`, a name bound twice). A reason says why Keras 3 fails, in one clause.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

# Names tf_keras 2.21's modules have and Keras 3.15's `tf.keras` modules lack (both packages'
# public names, compared by tests/processes/test_source_scan.py).
KERAS_2_ONLY_NAMES: dict[str, frozenset[str]] = {
    "backend": frozenset({
        "function", "in_test_phase", "in_train_phase", "learning_phase",
        "learning_phase_scope", "local_conv1d", "local_conv2d",
        "manual_variable_initialization", "normalize_batch_in_training", "placeholder",
        "print_tensor", "random_binomial", "reset_uids", "set_learning_phase"}),
    "layers": frozenset({"AbstractRNNCell", "DenseFeatures", "LocallyConnected1D",
                         "LocallyConnected2D"}),
    "callbacks": frozenset({"BaseLogger", "SidecarEvaluatorModelExport"}),
    "losses": frozenset({"kl_divergence", "log_cosh", "mean_absolute_error",
                         "mean_absolute_percentage_error", "mean_squared_error",
                         "mean_squared_logarithmic_error"}),
    "metrics": frozenset({"MeanRelativeError", "MeanTensor", "kl_divergence", "log_cosh",
                          "mean_absolute_error", "mean_absolute_percentage_error",
                          "mean_squared_error", "mean_squared_logarithmic_error"}),
    "constraints": frozenset({"RadialConstraint", "radial_constraint"}),
    "models": frozenset({"model_from_config", "model_from_yaml"}),
    "utils": frozenset({"GeneratorEnqueuer", "OrderedEnqueuer", "SequenceEnqueuer",
                        "SidecarEvaluator", "StepsPerExecutionTuner", "TimedThread",
                        "to_ordinal", "warmstart_embedding_matrix"}),
    "applications": frozenset({
        *(f"RegNet{kind}{size}" for kind in "XY" for size in (
            "002", "004", "006", "008", "016", "032", "040", "064", "080", "120", "160",
            "320")),
        *(f"ResNetRS{depth}" for depth in (50, 101, 152, 200, 270, 350, 420))}),
}
# The modules compared (those both have); the rest of `tf.keras` has the same names.
COMPARED_MODULES = (
    "backend", "layers", "callbacks", "optimizers", "losses", "metrics", "constraints",
    "initializers", "regularizers", "models", "utils", "activations", "mixed_precision",
    "applications", "datasets", "optimizers.schedules", "preprocessing",
    "preprocessing.image", "preprocessing.sequence", "preprocessing.text",
)
# Keywords of `Model` methods that tf_keras 2.21 takes and Keras 3.15 refuses (TypeError:
# unexpected keyword argument), from the two signatures.
KERAS_2_ONLY_KEYWORDS: dict[str, frozenset[str]] = {
    "fit": frozenset({"max_queue_size", "use_multiprocessing", "workers"}),
    "evaluate": frozenset({"max_queue_size", "use_multiprocessing", "workers"}),
    "predict": frozenset({"max_queue_size", "use_multiprocessing", "workers"}),
    "train_on_batch": frozenset({"reset_metrics"}),
    "test_on_batch": frozenset({"reset_metrics"}),
    "save_weights": frozenset({"options", "save_format"}),
    "load_weights": frozenset({"by_name", "options"}),
    "compile": frozenset({"pss_evaluation_shards", "sample_weight_mode",
                          "experimental_steps_per_execution"}),
}
# Layer keywords Keras 3 refuses ("Unrecognized keyword arguments passed to LSTM").
KERAS_2_ONLY_LAYER_KEYWORDS = frozenset({"dynamic", "time_major", "fused"})
# Keras 3 saves a model to these (saving_api.save_model) and loads these (load_model).
MODEL_FILES = (".keras", ".h5", ".hdf5")
# ModelCheckpoint's own check is stricter: .keras or .h5 (.weights.h5 for weights).
CHECKPOINT_FILES = (".keras", ".h5")
WEIGHTS_FILE = ".weights.h5"
# `x.save(path)` is Keras' only when x is a model: these modules' `save` are not.
NOT_KERAS_SAVE = ("np", "numpy", "jnp", "torch", "joblib", "pickle", "tf.saved_model",
                  "tf.io", "plt", "Image", "img", "image")
# tf.train.Checkpoint / CheckpointManager objects' `save` writes TensorFlow checkpoints,
# which Keras 3 leaves alone.
CHECKPOINT_OBJECT_WORDS = ("checkpoint", "ckpt", "manager")
# Keras 3's `load_weights` reads these; tf_keras also reads TensorFlow checkpoints.
WEIGHTS_LOAD_FILES = (".keras", ".weights.h5", ".h5", ".hdf5")


def keras_path(dotted: str) -> tuple[str, str] | None:
    """("layers", "LocallyConnected2D") for `tf.keras.layers.LocallyConnected2D` (and
    `tensorflow.keras...`, `keras...`): the module under keras and the name; else None."""
    parts = dotted.split(".")
    if "keras" not in parts:
        return None
    rest = parts[parts.index("keras") + 1:]
    if len(rest) >= 3 and ".".join(rest[:2]) in COMPARED_MODULES:
        return ".".join(rest[:2]), rest[2]
    if len(rest) >= 2:
        return rest[0], rest[1]
    return None


def missing_name(dotted: str) -> str | None:
    """Why `dotted` (an attribute chain or `from X import Y` as X.Y) fails under Keras 3:
    a name its `tf.keras` module lacks."""
    found = keras_path(dotted)
    if found is None:
        return None
    module, name = found
    if name in KERAS_2_ONLY_NAMES.get(module, ()):
        return f"Keras 3's tf.keras.{module} has no {name}"
    return None


def text_tail(node: ast.AST | None, constants: Mapping[str, ast.AST], depth: int = 0) -> str | None:
    """The end of the string `node` evaluates to, where the source fixes it: a literal, an
    f-string (`{}` for each value), `os.path.join(..., "ckpt-{epoch}")`, `a + "x"`,
    `folder / "x"`, `"...".format()`, `str(x)`, a name bound once in the file. None when a
    run-time value ends it (its extension is then unknown)."""
    if node is None or depth > 8:
        return None
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        text = "".join(str(part.value) if isinstance(part, ast.Constant) else "{}"
                       for part in node.values)
        return None if not node.values or not isinstance(node.values[-1], ast.Constant) \
            else text
    if isinstance(node, ast.Name):
        return text_tail(constants.get(node.id), constants, depth + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Div)):
        return text_tail(node.right, constants, depth + 1)
    if isinstance(node, ast.Call):
        name = _call_name(node)
        if name == "join" and node.args:
            return text_tail(node.args[-1], constants, depth + 1)
        if name in ("str", "Path") and len(node.args) == 1:
            return text_tail(node.args[0], constants, depth + 1)
        if name == "format" and isinstance(node.func, ast.Attribute):
            base = text_tail(node.func.value, constants, depth + 1)
            return None if base is None or base.endswith("}") else base
    return None


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else (
        func.id if isinstance(func, ast.Name) else "")


def _argument(node: ast.Call, keyword: str, position: int) -> ast.AST | None:
    for item in node.keywords:
        if item.arg == keyword:
            return item.value
    return node.args[position] if len(node.args) > position else None


def _true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def file_rule(node: ast.Call, receiver: str | None,
              constants: Mapping[str, ast.AST]) -> str | None:
    """Why a save, checkpoint or load call fails under Keras 3 (the file it names, or
    `save_format=`); None when it does not, or the path is not known from the source."""
    name = _call_name(node)
    if name in ("save", "save_model", "save_weights"):
        fmt = _argument(node, "save_format", 99)
        if fmt is not None and not (isinstance(fmt, ast.Constant) and fmt.value in (
                "h5", "keras")):
            return "Keras 3 has no save_format=: the file's extension decides (.keras, .h5)"
    if name == "ModelCheckpoint":
        tail = text_tail(_argument(node, "filepath", 0), constants)
        if _true(_argument(node, "save_weights_only", 4)):
            return None if tail is None or tail.endswith(WEIGHTS_FILE) else (
                "Keras 3's ModelCheckpoint(save_weights_only=True) writes only "
                f"{WEIGHTS_FILE} files")
        return None if tail is None or tail.endswith(CHECKPOINT_FILES) else (
            "Keras 3's ModelCheckpoint writes only .keras or .h5 files, not Keras 2's "
            "SavedModel checkpoints")
    if name == "save_weights":
        tail = text_tail(_argument(node, "filepath", 0), constants)
        return None if tail is None or tail.endswith(WEIGHTS_FILE) else (
            f"Keras 3 saves weights only to {WEIGHTS_FILE} files, not TensorFlow checkpoints")
    if name == "load_weights":
        tail = text_tail(_argument(node, "filepath", 0), constants)
        return None if tail is None or tail.endswith(WEIGHTS_LOAD_FILES) else (
            "Keras 3 loads weights only from .keras, .weights.h5 and .h5 files, not "
            "TensorFlow checkpoints")
    if name in ("save", "save_model"):
        return _model_save(node, name, receiver, constants)
    if name == "load_model":
        tail = text_tail(_argument(node, "filepath", 0), constants)
        return None if tail is None or tail.endswith(MODEL_FILES) else (
            "Keras 3 loads only .keras and .h5 files, not SavedModel folders")
    return None


def _model_save(node: ast.Call, name: str, receiver: str | None,
                constants: Mapping[str, ast.AST]) -> str | None:
    """`model.save(path)` / `save_model(model, path)` to a SavedModel folder. Another
    object's `save` (numpy, PIL, a tf.train.Checkpoint) is left alone: a receiver of
    those modules or named like a checkpoint is not a model, and a path with an extension
    of its own (image.png) is not a model's."""
    position = 1 if name == "save_model" else 0
    tail = text_tail(_argument(node, "filepath", position), constants)
    if tail is None or tail.endswith(MODEL_FILES):
        return None
    if name == "save":
        if receiver is None:
            return None  # a function of the script's own
        lowered = receiver.lower()
        if receiver in NOT_KERAS_SAVE or receiver.split(".")[0] in NOT_KERAS_SAVE or any(
                word in lowered.split(".")[-1] for word in CHECKPOINT_OBJECT_WORDS):
            return None
        leaf = tail.rsplit("/", 1)[-1]
        if "model" not in lowered.split(".")[-1] and "." in leaf.strip("."):
            return None  # report.txt, image.png: a model saves to a folder or .keras
    return ("Keras 3 saves a model only to a .keras or .h5 file, not a SavedModel folder "
            "(model.export() writes one)")


def call_rule(node: ast.Call, receiver: str | None) -> tuple[str, str] | None:
    """(the API as shown, why Keras 3 refuses it) for keywords and arguments Keras 3's
    methods and layers do not take, and `tf.keras.Input(500)`; else None."""
    name = _call_name(node)
    keywords = {item.arg for item in node.keywords if item.arg is not None}
    if receiver is not None and (refused := keywords & KERAS_2_ONLY_KEYWORDS.get(name, set())):
        word = sorted(refused)[0]
        return f".{name}({word}=...)", f"Keras 3's {name}() has no {word}= argument"
    if refused := keywords & KERAS_2_ONLY_LAYER_KEYWORDS:
        word = sorted(refused)[0]
        return f"{name}({word}=...)", f"Keras 3 layers take no {word}= argument"
    if name in ("Input", "InputLayer"):
        shape = _argument(node, "input_shape" if name == "InputLayer" else "shape", 0)
        for key in ("shape", "batch_shape", "input_shape"):
            shape = shape if shape is not None else _argument(node, key, 99)
        if isinstance(shape, ast.Constant) and isinstance(shape.value, int):
            return (f"{name}({shape.value})",
                    f"Keras 3 takes a shape as a tuple, ({shape.value},), not an integer")
    if name == "add_weight" and node.args and isinstance(node.args[0], ast.Constant) and \
            isinstance(node.args[0].value, str):
        return ".add_weight('name', ...)", "Keras 3's add_weight takes name= as a keyword only"
    if name == "minimize" and receiver is not None and _optimizer(receiver):
        return ".minimize()", "Keras 3 optimizers have no minimize(): use apply_gradients"
    return None


def _optimizer(dotted: str) -> bool:
    leaf = dotted.split(".")[-1].lower()
    return leaf in ("opt", "optim") or leaf.endswith("optimizer")


def attribute_rule(dotted: str) -> tuple[str, str] | None:
    """`optimizer.lr` (read or set): Keras 3 optimizers have only learning_rate."""
    head, _, leaf = dotted.rpartition(".")
    if leaf == "lr" and head and _optimizer(head):
        return f"{head}.lr", "Keras 3 optimizers have learning_rate, not lr"
    return None


__all__ = ["KERAS_2_ONLY_KEYWORDS", "KERAS_2_ONLY_NAMES", "attribute_rule", "call_rule",
           "file_rule", "missing_name", "text_tail"]
