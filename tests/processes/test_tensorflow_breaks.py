"""TensorFlow's breaking changes (launcher/tensorflow_breaks.py) and results read by position
(launcher/result_order.py): the scan's findings from minimal scripts (no TensorFlow), and,
marked slow, each catalogue snippet run under Keras 3 and tf_keras, the run-time note on the
real error, and the two Keras' real result orders against the model's.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_env.launcher import tensorflow_breaks
from mgpu_env.launcher.result_order import compile_order, positional_reads
from mgpu_env.launcher.source_scan import scan_script
from tests.support.children import child_env

PRELUDE = """\
import numpy as np
import tensorflow as tf
def model():
    m = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    m.compile(optimizer="sgd", loss="mse")
    return m
"""
SCHEDULE = (
    "class Warmup(tf.keras.optimizers.schedules.LearningRateSchedule):\n"
    "    def __call__(self, step):\n"
    "        return 0.01 * tf.math.minimum(tf.math.rsqrt(step), step * 4000 ** -1.5)\n"
    "opt = tf.keras.optimizers.Adam(Warmup()); v = tf.Variable(1.0)\n"
    "opt.apply_gradients([(tf.constant(1.0), v)])"
)
# (snippet, the record's key, what it does under Keras 3 and under tf_keras: "failed" or "ran"
# where the change is silent: the profile not written, the decay ignored).
CATALOGUE = [
    ("tf.Session()", "tf1-api", "failed", "failed"),
    ("tf.train.AdamOptimizer(0.1)", "tf1-api", "failed", "failed"),
    ("tf.set_random_seed(1)", "tf1-api", "failed", "failed"),
    ("tf.contrib.layers.flatten", "contrib", "failed", "failed"),
    ("tf.data.Dataset.range(2).make_one_shot_iterator()", "one-shot-iterator", "failed",
     "failed"),
    ("tf.keras.layers.CuDNNLSTM(2)", "cudnn-layers", "failed", "failed"),
    ("tf.string_split(['a b'])", "tf1-api", "failed", "failed"),
    ("tf.config.experimental_list_devices()", "list-devices", "failed", "failed"),
    ("tf.distribute.get_strategy().experimental_run_v2(lambda: 1)", "run-v2", "failed",
     "failed"),
    ("tf.distribute.get_strategy().experimental_make_numpy_dataset(np.zeros(2))",
     "numpy-dataset", "failed", "failed"),
    ("v = tf.Variable(1.0); tf.keras.optimizers.SGD().apply_gradients("
     "[(tf.constant(1.0), v)], all_reduce_sum_gradients=False)", "aggregate-gradients",
     "failed", "ran"),  # tf_keras takes it and ignores it
    ("tf.keras.utils.multi_gpu_model(model(), 2)", "multi-gpu-model", "failed", "failed"),
    ("tf.train.experimental.enable_mixed_precision_graph_rewrite(tf.keras.optimizers.SGD())",
     "graph-rewrite", "failed", "failed"),
    ("model().to_yaml()", "yaml", "failed", "failed"),
    ("model().predict_proba(np.zeros((1, 2)))", "predict-classes", "failed", "failed"),
    ("tf.keras.mixed_precision.experimental.set_policy('float32')",
     "mixed-precision-experimental", "failed", "failed"),
    ("tf.keras.layers.Attention(causal=True)", "causal-attention", "failed", "ran"),
    ("tf.keras.optimizers.Adam().get_updates(None, [])", "optimizer-updates", "failed",
     "failed"),
    ("tf.keras.optimizers.Adam(0.1, decay=1e-3)", "optimizer-decay", "ran", "failed"),
    (SCHEDULE, "schedule-int64-step", "failed", "failed"),
    ("class Decay(tf.keras.optimizers.schedules.LearningRateSchedule):\n"
     "    def __call__(self, step):\n"
     "        return 0.1 * 0.5 ** (step * 0.01)\n"
     "m = model(); m.compile(tf.keras.optimizers.SGD(Decay()), 'mse')\n"
     "m.fit(np.zeros((4, 2)), np.zeros((4, 1)), verbose=0)", "schedule-int64-arithmetic", "ran",
     "failed"),
    ("s = tf.distribute.get_strategy(); strategy = s\n"
     "strategy.reduce(tf.distribute.ReduceOp.SUM, tf.constant(1.0))", "reduce-axis", "failed",
     "failed"),
    ("tf.config.experimental.enable_mlir_graph_optimization()", "config-mlir", "failed",
     "failed"),
    ("assert not type(tf.constant(1.0)) == tf.Tensor", "tensor-type", "ran", "ran"),
    ("tf.estimator.RunConfig()", "estimator", "failed", "failed"),
    ("tf.summary.trace_on(graph=True, profiler=True)", "trace-profiler", "ran", "ran"),
]
# The fixes each record names: nothing to find.
FIXED = """\
import tensorflow.compat.v1 as v1
from tensorflow.compat import v1 as compat
class Warmup(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        return tf.math.rsqrt(step) * step ** -1.5
class Decay(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 0.1 * 0.5 ** (step / 100)
v1.Session; compat.placeholder
iter(tf.data.Dataset.range(2))
tf.distribute.get_strategy().run(lambda: 1)
tf.keras.optimizers.Adam(learning_rate=0.1, clipnorm=1.0)
isinstance(tf.constant(1.0), tf.Tensor)
tf.summary.trace_on(graph=True, profiler=True, profiler_outdir="/tmp/x")
tf.keras.layers.Attention()([tf.zeros((1, 2, 2)), tf.zeros((1, 2, 2))], use_causal_mask=True)
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train.py"
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(("snippet", "key"), [(s, k) for s, k, _, _ in CATALOGUE])
def test_each_change_is_found_with_its_line_release_and_fix(
    tmp_path: Path, snippet: str, key: str
) -> None:
    scan = scan_script(write(tmp_path, PRELUDE + snippet + "\n"))
    first = PRELUDE.count("\n") + 1
    change = tensorflow_breaks.BY_KEY[key]
    if change.keras_2_runs:  # tf_keras runs it: Keras 2 code, which KERAS=auto switches for
        (finding,) = scan.keras_2
        assert finding.why == change.says() and scan.removed == ()
        assert f"TensorFlow {change.version}: " in (scan.keras_2_why() or "")
        return
    found = [f for f in scan.removed if f.kind == "changed"]
    assert found and {f.fix for f in found} == {change.says()}, [f.api for f in scan.removed]
    assert all(first <= f.line <= first + snippet.count("\n") for f in found)
    assert scan.keras_2_evidence() is None  # KERAS=2 would not help
    note = scan.notes()[0]
    assert f"TensorFlow {change.version}: " in note and "Fix: " in note
    assert ("under Keras 2 and 3 alike" in note) is (change.fails_under == ("2", "3"))
    for keras in ("2", "3"):  # told only under the Keras it fails under
        assert any(f"TensorFlow {change.version}: " in line for line in scan.notes(keras)) is (
            keras in change.fails_under)


def test_every_record_has_a_catalogue_snippet_or_an_error() -> None:
    keys = {key for _, key, _, _ in CATALOGUE}
    for change in tensorflow_breaks.BREAKS:
        assert change.key in keys, change.key
        assert change.version.startswith("2.") and change.note and change.fix


def test_the_fixed_code_and_tf1_code_under_compat_v1_find_nothing(tmp_path: Path) -> None:
    scan = scan_script(write(tmp_path, PRELUDE + FIXED))
    assert scan.removed == () and scan.keras_2 == (), [f.api for f in scan.removed]
    tf1 = "import tensorflow.compat.v1 as tf\ntf.disable_v2_behavior()\ntf.Session()\n"
    assert scan_script(write(tmp_path, tf1)).removed == ()


ORDER_CASES = [
    # (compile, read, fires under Keras 3)
    ("metrics=['accuracy']", "loss, acc = m.evaluate(x, y)", False),
    ("metrics=['accuracy']", "score = m.evaluate(x, y)\nprint(score[1])", False),
    ("metrics=['accuracy']", "list(h.history.values())[1]", True),
    ("metrics=['accuracy']", "loss, acc = h.history.values()", True),
    ("metrics=['accuracy']", "r = m.evaluate(x, y, return_dict=True)\nlist(r.values())[0]",
     True),
    ("metrics=['mae']", "list(h.history.values())[1]", False),  # 'loss' < 'mae' either way
    ("metrics=[tf.keras.metrics.AUC(), 'accuracy']", "list(h.history)[2]", True),
    ("metrics=metrics_from_flags", "list(h.history.values())[1]", False),  # names unknown
    ("loss={'b': 'mse', 'a': 'mae'}, metrics={'b': ['mse', 'accuracy'], 'a': 'mae'}",
     "loss, bl, al, bm, ba, am = m.evaluate(x, y)", True),
    ("loss={'a': 'mae', 'b': 'mse'}, metrics={'a': 'mae', 'b': ['accuracy', 'mse']}",
     "m.test_on_batch(x, y)[3]", False),  # the metrics' names already sort so
    ("loss={'b': 'mse', 'a': 'mae'}, metrics={'b': ['mse', 'accuracy'], 'a': 'mae'}",
     "m.evaluate(x, y)[0]", False),  # the loss comes first in both
    ("metrics=['accuracy']", "list(h.history)[-1]", True),
    ("metrics=['accuracy']", "loss, acc = m.evaluate(x, y, return_dict=True).values()", True),
    ("metrics=['accuracy', 'mae']", "print(dict(zip(m.metrics_names, m.evaluate(x, y))))", True),
    ("metrics=None", "print(dict(zip(m.metrics_names, [m.evaluate(x, y)])))", False),
    ("loss=['mse', 'mae'], metrics=[['mse', 'accuracy'], ['mae']]",
     "r = m.train_on_batch(x, y)\nr[3]", False),  # output names not in the source
]


@pytest.mark.parametrize(("compiled", "read", "fires"), ORDER_CASES)
def test_a_read_by_position_is_told_only_where_the_orders_differ(
    tmp_path: Path, compiled: str, read: str, fires: bool
) -> None:
    text = (f"import tensorflow as tf\nm = build()\nm.compile(optimizer='sgd', loss='mse', "
            f"{compiled})\nh = m.fit(x, y)\n{read}\n").replace("loss='mse', loss=", "loss=")
    scan = scan_script(write(tmp_path, text))
    assert bool(scan.positional) is fires, [f.why for f in scan.positional]
    if fires:
        (finding,) = scan.positional
        assert finding.line == text.count("\n") and "Keras 3" in finding.why
        assert any(finding.where in note for note in scan.notes("3"))
        assert not any(finding.where in note for note in scan.notes("2"))  # Keras 2's order


CHECK_EACH = """\
import json, sys, warnings
from mgpu_env.launcher.tensorflow_breaks import error_note
prelude, snippets = json.load(open(sys.argv[1]))
results = {}
for snippet in snippets:
    try:
        exec(prelude + snippet, {})
    except Exception as err:
        results[snippet] = ["failed", error_note(err), f"{type(err).__name__}: {err}"[:300]]
    else:
        results[snippet] = ["ran", None, ""]
print("RESULTS " + json.dumps(results))
"""
ORDERS = """\
import json
import numpy as np
import tensorflow as tf
K = tf.keras
x = np.random.rand(8, 2).astype("float32"); y = np.random.rand(8, 1).astype("float32")
def one(metrics):
    m = K.Sequential([K.Input((2,)), K.layers.Dense(1)]); m.compile("sgd", "mse", metrics=metrics)
    return m, y
def two():
    i = K.Input((2,))
    m = K.Model(i, [K.layers.Dense(1, name="b")(i), K.layers.Dense(1, name="a")(i)])
    m.compile("sgd", {"b": "mae", "a": "mse"}, metrics={"b": ["mse", "accuracy"], "a": "mae"})
    return m, [y, y * 3]
out = {}
for name, (m, yy) in {"acc": one(["accuracy"]), "auc": one([K.metrics.AUC(), "mae"]),
                      "two": two()}.items():
    h = m.fit(x, yy, verbose=0)
    d = m.evaluate(x, yy, verbose=0, return_dict=True)
    listed = m.evaluate(x, yy, verbose=0)
    out[name] = {"list": [[k for k, v in d.items() if abs(v - r) < 1e-9] for r in listed],
                 "history": list(h.history), "names": list(m.metrics_names)}
print("ORDERS " + json.dumps(out))
"""
ORDER_COMPILES = {
    "acc": "m.compile('sgd', 'mse', metrics=['accuracy'])",
    "auc": "m.compile('sgd', 'mse', metrics=[K.metrics.AUC(), 'mae'])",
    "two": "m.compile('sgd', {'b': 'mae', 'a': 'mse'}, metrics={'b': ['mse', 'accuracy'], "
           "'a': 'mae'})",
}


def child(tmp_path: Path, legacy: str, script: str, *args: str) -> str:
    path = tmp_path / f"child_{legacy}.py"
    path.write_text(script)
    env = child_env(tmp_path, TF_USE_LEGACY_KERAS=legacy, TF_CPP_MIN_LOG_LEVEL="3",
                    CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(path), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    return done.stdout + "\n" + done.stderr[-3000:]


def tagged(output: str, tag: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith(tag + " ")]
    assert lines, output[-3000:]
    return json.loads(lines[-1][len(tag) + 1:])


@pytest.mark.slow
def test_each_change_does_what_its_record_says_under_both_keras(tmp_path: Path) -> None:
    data = tmp_path / "snippets.json"
    data.write_text(json.dumps([PRELUDE, [s for s, _, _, _ in CATALOGUE]]))
    for legacy, column in (("0", 2), ("1", 3)):
        results = tagged(child(tmp_path, legacy, CHECK_EACH, str(data)), "RESULTS")
        for entry in CATALOGUE:
            outcome, note, text = results[entry[0]]
            assert outcome == entry[column], (legacy, entry[1], text)
            if entry[1] in ("schedule-int64-step", "optimizer-updates") or (
                    entry[1] == "optimizer-decay" and outcome == "failed"):
                # Only the run shows these: the error's note names the release and the fix.
                change = tensorflow_breaks.BY_KEY[entry[1]]
                assert note is not None and change.says() in note, (legacy, entry[1], text)


@pytest.mark.slow
def test_the_order_model_is_what_keras_3_and_tf_keras_return(tmp_path: Path) -> None:
    keras_3 = tagged(child(tmp_path, "0", ORDERS), "ORDERS")
    keras_2 = tagged(child(tmp_path, "1", ORDERS), "ORDERS")
    for name, source in ORDER_COMPILES.items():
        order = compile_order(ast.parse(source).body[0].value)  # type: ignore[attr-defined]
        assert order.keras_2 is not None
        # Each position's value is the named metric's (equal values may name two).
        for got, expected in ((keras_2, order.keras_2), (keras_3, order.keras_3_list)):
            assert expected is not None and len(got[name]["list"]) == len(expected), name
            assert all(want in names for names, want in zip(
                got[name]["list"], expected, strict=True)), (name, got[name], expected)
        assert keras_2[name]["history"] == list(order.keras_2)
        assert keras_3[name]["history"] == list(order.keras_3_dict or ())
    assert order.keras_3_list != order.keras_2  # the two-output case does differ
    # `metrics_names`: Keras 2 lists every result, Keras 3 the compiled metrics as one entry.
    for name, source in ORDER_COMPILES.items():
        text = f"{source}\nprint(m.metrics_names)\n"
        (read,) = positional_reads(ast.parse(text))
        assert keras_2[name]["names"] == list(read.keras_2)
        assert keras_3[name]["names"] == list(read.keras_3)


# A Keras 2 era custom loop with the Transformer tutorial's warmup schedule (its TF 2.x
# wording, before the tutorial cast the step): since 2.11 the optimizer passes an int64 step.
KERAS_2_ERA_LOOP = '''\
import tensorflow as tf


class CustomSchedule(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, d_model, warmup_steps=4000):
        super().__init__()
        self.d_model = tf.cast(d_model, tf.float32)
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        arg1 = tf.math.rsqrt(step)
        arg2 = step * (self.warmup_steps ** -1.5)
        return tf.math.rsqrt(self.d_model) * tf.math.minimum(arg1, arg2)


strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.Adam(CustomSchedule(64), beta_1=0.9, beta_2=0.98)


@tf.function
def train_step(x, y):
    def replica(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return strategy.run(replica, args=(x, y))


data = tf.data.Dataset.from_tensor_slices((tf.zeros((8, 4)), tf.zeros((8, 1)))).batch(4)
for x, y in strategy.experimental_distribute_dataset(data):
    train_step(x, y)
'''


@pytest.mark.slow
@pytest.mark.parametrize("keras", ["auto", "2"])
def test_the_int64_schedule_step_is_told_before_and_after_the_run(
    tmp_path: Path, keras: str
) -> None:
    from tests.support.run_process import mgpu

    (tmp_path / "loop.py").write_text(KERAS_2_ERA_LOOP)
    result = mgpu(tmp_path, ["loop.py"], QUIET="0", VIRTUAL_DEVICES="2", KERAS=keras)
    change = tensorflow_breaks.BY_KEY["schedule-int64-step"]
    assert result.returncode == 1, result.stderr[-3000:]
    summary = result.stderr.split("Traceback", 1)[0]
    assert "`CustomSchedule.__call__` at loop.py:11: TensorFlow 2.11: " in summary, summary
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mgpu run: note: this error is a change TensorFlow made") and \
        change.says() in last, result.stderr[-2000:]
    assert "KERAS=2 mgpu run" not in result.stderr  # Keras 2 fails the same way


def test_the_ledger_counts_its_rows_and_names_every_record() -> None:
    import re
    from collections import Counter

    page = (Path(__file__).resolve().parents[2] / "docs" / "tensorflow-breaks.md").read_text()
    rows = [line for line in page.splitlines() if re.match(r"\| 2\.\d+ \|", line)]
    kinds: Counter[str] = Counter()
    for row in rows:
        status = row.rstrip(" |").rsplit("|", 1)[-1].strip()
        kinds[status.split(":")[0] if status.startswith("left out") else status.split()[0]] += 1
    # The count table, in its order: listed, rules, keras_3_breaks, then the left-out kinds.
    said = [int(n) for n in re.findall(r"^\| (?:listed|covered|left out)[^|]*\| (\d+) \|$",
                                       page, re.MULTILINE)]
    assert said == [len(rows), kinds["rule"], kinds["keras_3_breaks"],
                    kinds["left out (not a training script's)"], kinds["left out (silent)"],
                    kinds["left out (still works here)"], kinds["left out (other)"]]
    assert sum(kinds.values()) == len(rows) and kinds["keras_3_breaks"] > 0
    for change in tensorflow_breaks.BREAKS:
        assert f"`{change.key}`" in page, change.key
