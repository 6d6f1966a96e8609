"""TensorFlow's own breaking changes and removals since 2.0, as a model: one record per change.

Keras 2 -> Keras 3 (`keras_3_breaks.py`) is one of them (2.16). These are the others that a
training script can meet, each as its release note states it (TensorFlow's RELEASE.md, the
`Breaking Changes` sections; `docs/tensorflow-breaks.md` counts them, and lists the ones
left out and why). A record says how the change shows:

- `chains`: names that are gone (`tf.estimator`, `tf.Session`), matched on the attribute
  chain or import as written (`tensorflow.` is read as `tf.`), by the source scan;
- `methods`: methods that are gone (`strategy.experimental_run_v2`), by the source scan;
- `keywords`: a call's keyword that is refused or ignored now, (callee leaf, keyword);
- `error`: what the failure says when only the run shows it (the error note, after the
  script's traceback), with `frame` the class whose code the traceback must pass through.

Every API here fails (or is ignored) under TensorFlow 2.21 with Keras 3 and with tf_keras
alike, KERAS=2 does not help and the fix is to change the line; except those marked
`keras_2_runs`, which tf_keras still runs (the scan treats them as Keras 2 code).
tests/processes/test_tensorflow_breaks.py runs each record's example under both (slow); the
scan tests need no TensorFlow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import TracebackType


@dataclass(frozen=True)
class Break:
    """One breaking change or removal, from TensorFlow's release notes."""

    key: str
    version: str  # the TensorFlow release that made it
    note: str  # the release note's words, shortened
    fix: str  # what to write instead
    chains: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    keywords: tuple[tuple[str, str], ...] = ()
    error: str = ""  # a regex of `Type: message` where only the run shows it
    frame: str = ""  # ... raised inside this class's code (a base class name)
    # tf_keras (Keras 2) still runs it, only Keras 3 refuses it: the scan counts it as Keras 2
    # code, so KERAS=auto gives the script tf_keras, as for keras_3_breaks' rules.
    keras_2_runs: bool = False
    # The Keras (`tf.keras`) under which it fails; the scan tells it only under those.
    fails_under: tuple[str, ...] = ("2", "3")

    def says(self) -> str:
        """The note's text: what changed, in which release, and the fix."""
        return f"TensorFlow {self.version}: {self.note}. Fix: {self.fix}"


# TensorFlow 1.x names that 2.0 removed from `tf` (tf_upgrade_v2's table, the ones training
# scripts use most); tf.compat.v1 keeps most of them, for graph-mode code only.
TF1_NAMES = (
    "tf.Session", "tf.InteractiveSession", "tf.placeholder", "tf.ConfigProto", "tf.GPUOptions",
    "tf.global_variables_initializer", "tf.local_variables_initializer", "tf.get_variable",
    "tf.variable_scope", "tf.train.Saver", "tf.train.AdamOptimizer",
    "tf.train.GradientDescentOptimizer", "tf.train.MomentumOptimizer",
    "tf.train.RMSPropOptimizer", "tf.train.AdagradOptimizer",
    "tf.train.get_or_create_global_step", "tf.layers", "tf.logging", "tf.app", "tf.flags",
    "tf.set_random_seed", "tf.random.set_random_seed", "tf.enable_eager_execution",
    "tf.to_float", "tf.to_int32", "tf.to_int64", "tf.log", "tf.image.resize_images",
    "tf.losses.sparse_softmax_cross_entropy", "tf.losses.softmax_cross_entropy",
    "tf.losses.mean_squared_error", "tf.summary.FileWriter", "tf.summary.merge_all",
    "tf.string_split",
)
# The learning-rate schedule's step (2.11): float-only ops that refuse an int64 step.
# Eager and traced (tf.function, where Keras 3 applies gradients) wordings alike.
INT64_REFUSED = r"(Value for attr 'T' of int64 is not in the list of allowed values|" \
                r"has DataType int64 not in list of allowed values|" \
                r"Input '\w+' of '\w+' Op has type \w+ that does not match type int64|" \
                r"Cannot convert [^ ]+ to EagerTensor of dtype int64|" \
                r"expected to be a (float|double) tensor but is a int64 tensor|" \
                r"x and y must have the same dtype, got tf\.(float32|float64) != tf\.int64|" \
                r"cannot compute \w+ as input #\d+(\(zero-based\))? was expected to be a " \
                r"(float|double) tensor but is a int64 tensor)"

BREAKS: tuple[Break, ...] = (
    Break("tf1-api", "2.0", "the TensorFlow 1.x API (sessions, placeholders, tf.layers, "
          "tf.train optimizers, tf.logging...) is no longer in `tf`",
          "TF 2 code (eager, tf.function, tf.keras); tf.compat.v1.<name> still runs graph-mode "
          "code", chains=TF1_NAMES),
    Break("contrib", "2.0", "`tf.contrib` has been deprecated, and functionality has been "
          "either migrated to the core TensorFlow API, to an ecosystem project such as "
          "tensorflow/addons or tensorflow/io, or removed entirely",
          "the core API (tf.*) or the ecosystem package that took it over",
          chains=("tf.contrib",)),
    Break("one-shot-iterator", "2.0", "`Dataset.make_one_shot_iterator()` and "
          "`make_initializable_iterator()` are removed from tf.data.Dataset",
          "iter(dataset), or a for loop over the dataset",
          methods=("make_one_shot_iterator", "make_initializable_iterator")),
    Break("cudnn-layers", "2.0", "CuDNNLSTM and CuDNNGRU are removed: LSTM and GRU use cuDNN "
          "when their arguments allow", "tf.keras.layers.LSTM / GRU",
          chains=("layers.CuDNNLSTM", "layers.CuDNNGRU")),
    Break("reduce-axis", "2.0", "`Strategy.reduce` takes the `axis` to reduce over (None for "
          "per-replica values) as a required argument", "strategy.reduce(ReduceOp.SUM, value, "
          "axis=None)"),
    Break("list-devices", "2.1", "`tf.config.experimental_list_devices` has been removed",
          "tf.config.list_logical_devices()", chains=("tf.config.experimental_list_devices",)),
    Break("run-v2", "2.2", "`experimental_run_v2` is renamed `run` on tf.distribute strategies "
          "(the old name is gone)", "strategy.run(fn, args=...)",
          methods=("experimental_run_v2",)),
    Break("numpy-dataset", "2.4", "`experimental_make_numpy_dataset` is removed from "
          "tf.distribute strategies", "tf.data.Dataset.from_tensor_slices(x), then "
          "strategy.experimental_distribute_dataset", methods=("experimental_make_numpy_dataset",)),
    Break("aggregate-gradients", "2.2", "`Optimizer.apply_gradients` takes "
          "`experimental_aggregate_gradients` in place of `all_reduce_sum_gradients` (tf_keras "
          "ignores the old keyword, Keras 3 refuses it)",
          "drop it: apply_gradients aggregates across replicas itself",
          keywords=(("apply_gradients", "all_reduce_sum_gradients"),), keras_2_runs=True),
    Break("multi-gpu-model", "2.4", "`tf.keras.utils.multi_gpu_model` is removed",
          "tf.distribute.MirroredStrategy", chains=("utils.multi_gpu_model",)),
    Break("graph-rewrite", "2.6", "`tf.train.experimental.enable_mixed_precision_graph_rewrite` "
          "is removed, as the API only works in graph mode and is not customizable",
          "tf.keras.mixed_precision.set_global_policy('mixed_float16')",
          chains=("tf.train.experimental.enable_mixed_precision_graph_rewrite",)),
    Break("yaml", "2.6", "`Model.to_yaml()` and `keras.models.model_from_yaml` raise a "
          "RuntimeError (arbitrary code execution)", "model.to_json() / model_from_json, "
          "or model.save('m.keras')", methods=("to_yaml",)),
    Break("predict-classes", "2.6", "`Sequential.predict_classes` and `predict_proba` are "
          "removed", "np.argmax(model.predict(x), axis=-1)",
          methods=("predict_classes", "predict_proba")),
    Break("mixed-precision-experimental", "2.9", "the `tf.keras.mixed_precision.experimental` "
          "API has been removed", "tf.keras.mixed_precision.set_global_policy / Policy / "
          "LossScaleOptimizer", chains=("mixed_precision.experimental",)),
    Break("causal-attention", "2.10", "causal attention in `Attention` and `AdditiveAttention` "
          "is specified in the call() method via `use_causal_mask` (rather than in the "
          "constructor; tf_keras still takes the old keyword, Keras 3 refuses it)",
          "layer(inputs, use_causal_mask=True)",
          keywords=(("Attention", "causal"), ("AdditiveAttention", "causal")), keras_2_runs=True),
    Break("optimizer-updates", "2.11", "the new Keras optimizer has a different set of public "
          "APIs from the old optimizer (no get_updates, get_gradients)", "tape.gradient(loss, "
          "variables), then optimizer.apply_gradients(zip(grads, variables))",
          methods=("get_updates", "get_gradients"),
          error=r"AttributeError: '\w+' object has no attribute '(get_updates|get_gradients)'"),
    Break("optimizer-decay", "2.11", "the new optimizers take no `decay` argument (tf_keras: "
          "ValueError; Keras 3: ignored with a warning, so the rate no longer decays)",
          "a schedule: learning_rate=tf.keras.optimizers.schedules.InverseTimeDecay(lr, 1, "
          "decay)", keywords=tuple((name, "decay") for name in (
              "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "Nadam",
              "Ftrl")),
          error=r"decay is deprecated in the new (TF-)?Keras optimizer"),
    Break("schedule-int64-step", "2.11", "when using a LearningRateSchedule, the new optimizer "
          "calls it with the optimizer's iteration count, an int64 tensor (the old one cast "
          "it to float first)", "step = tf.cast(step, tf.float32) as the first line of the "
          "schedule's __call__", error=INT64_REFUSED, frame="LearningRateSchedule"),
    Break("schedule-int64-arithmetic", "2.11", "the new optimizers call a LearningRateSchedule "
          "with an int64 step, which tf_keras' tensors refuse in float arithmetic (Keras 3 "
          "passes a variable whose operators promote it)", "step = tf.cast(step, tf.float32) as "
          "the first line of the schedule's __call__", fails_under=("2",)),
    Break("config-mlir", "2.12", "`tf.config.experimental.enable_mlir_graph_optimization` and "
          "`disable_mlir_graph_optimization`: experimental API removed", "drop the call",
          chains=("tf.config.experimental.enable_mlir_graph_optimization",
                  "tf.config.experimental.disable_mlir_graph_optimization")),
    Break("tensor-type", "2.14", "the class hierarchy for tf.Tensor has changed: code that "
          "relied on the exact type of Tensor (type(t) == tf.Tensor) must use isinstance",
          "isinstance(t, tf.Tensor)"),
    Break("estimator", "2.16", "the tf.estimator API is removed (use TF 2.15 or earlier to "
          "keep it)", "tf.keras Model.fit, or a custom loop with tf.distribute",
          chains=("tf.estimator", "tensorflow_estimator")),
    Break("trace-profiler", "2.16", "`tf.summary.trace_on` now takes a `profiler_outdir` "
          "argument, which must be set if `profiler` is True; trace_export's profiler_outdir "
          "is a no-op", "tf.summary.trace_on(graph=True, profiler=True, "
          "profiler_outdir=logdir)"),
)
BY_KEY = {entry.key: entry for entry in BREAKS}


def _canonical(dotted: str) -> str:
    head, _, rest = dotted.partition(".")
    return f"tf.{rest}" if head == "tensorflow" and rest else (
        "tf" if head == "tensorflow" else dotted)


# Every chain once, with its record: `tf.`-rooted ones match from the start of a name,
# the others (`layers.CuDNNLSTM`) anywhere on a dot boundary.
_ROOTED = {chain: entry for entry in BREAKS for chain in entry.chains
           if chain.startswith("tf.") or chain == "tensorflow_estimator"}
_ANYWHERE = tuple((f".{chain}.", entry) for entry in BREAKS for chain in entry.chains
                  if chain not in _ROOTED)


def chain_break(dotted: str) -> Break | None:
    """The change that removed `dotted` (a name as written, after import aliases), if any."""
    name = _canonical(dotted)
    parts = name.split(".")
    for end in range(len(parts), 0, -1):  # tf.train.AdamOptimizer.x: longest prefix first
        if (entry := _ROOTED.get(".".join(parts[:end]))) is not None:
            return entry
    padded = f".{name}."
    return next((entry for chain, entry in _ANYWHERE if chain in padded), None)


_METHODS = {method: entry for entry in BREAKS for method in entry.methods}
_KEYWORDS: dict[str, dict[str, Break]] = {}
for _entry in BREAKS:
    for _callee, _keyword in _entry.keywords:
        _KEYWORDS.setdefault(_callee, {})[_keyword] = _entry


def method_break(name: str) -> Break | None:
    """The change that removed the method `name` (called on anything)."""
    return _METHODS.get(name)


def keyword_break(callee: str, keywords: set[str]) -> tuple[Break, str] | None:
    """The change that took away a keyword `callee(...)` passes, and that keyword."""
    refused = _KEYWORDS.get(callee)
    if not refused or not keywords:
        return None
    keyword = next((word for word in sorted(keywords) if word in refused), None)
    return None if keyword is None else (refused[keyword], keyword)


def _passes_through(tb: TracebackType | None, base: str) -> bool:
    """Whether a frame of the traceback runs a method of a class with `base` in its MRO."""
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if owner is not None and any(cls.__name__ == base for cls in type(owner).__mro__):
            return True
        tb = tb.tb_next
    return False


def error_break(err: BaseException) -> Break | None:
    """The change a script's error shows (one with `error`), else None."""
    text = f"{type(err).__name__}: {err}"
    for entry in BREAKS:
        if entry.error and re.search(entry.error, text) and (
                not entry.frame or _passes_through(err.__traceback__, entry.frame)):
            return entry
    return None


def error_note(err: BaseException) -> str | None:
    """After a script failed: the TensorFlow change its error shows and the fix, one line
    for `mgpu run`'s end notes; None when the error is none of these."""
    entry = error_break(err)
    if entry is None:
        return None
    return (f"mgpu run: note: this error is a change TensorFlow made, under Keras 2 and 3 "
            f"alike: {entry.says()}")


__all__ = ["BREAKS", "BY_KEY", "Break", "chain_break", "error_break", "error_note",
           "keyword_break", "method_break"]
