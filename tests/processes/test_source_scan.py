"""The source scan of `mgpu run` (launcher/source_scan.py) and the Keras 2 failure notes.

The fast tests read sources only. The slow one runs every snippet of the catalogue in two
real processes, tf.keras = Keras 3 and tf.keras = tf_keras, and holds each entry to what
the code claims of it: Keras 2 only (fails in Keras 3 with an error the failure note
recognises, runs in tf_keras), or gone from both.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mgpu_env.launcher.source_scan import MAX_FILES, scan_script
from tests.support.children import child_env

# (snippet, the API the scan reports, kind): each runs after PRELUDE.
PRELUDE = """\
import numpy as np
import tensorflow as tf
def model():
    m = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    m.compile(optimizer="sgd", loss="mse")
    return m
def batches():
    while True:
        yield np.zeros((2, 2), "float32"), np.zeros((2, 1), "float32")
"""
KERAS_2_ONLY = [
    ("tf.keras.metrics.Mean().reset_states()", ".reset_states()"),
    ("tf.keras.optimizers.legacy.Adam()", "tf.keras.optimizers.legacy.Adam"),
    ("tf.keras.optimizers.experimental.AdamW()", "tf.keras.optimizers.experimental.AdamW"),
    ("tf.keras.layers.experimental.preprocessing.Rescaling(1 / 255)",
     "tf.keras.layers.experimental.preprocessing.Rescaling"),
    ("tf.keras.experimental.CosineDecay(0.1, 10)", "tf.keras.experimental.CosineDecay"),
    ("tf.keras.optimizers.SGD(lr=0.1)", "SGD(lr=...)"),
    ("model().fit_generator(batches(), steps_per_epoch=1, verbose=0)", ".fit_generator()"),
    ("model().evaluate_generator(batches(), steps=1)", ".evaluate_generator()"),
    ("model().predict_generator((x for x, _ in batches()), steps=1)", ".predict_generator()"),
    ("tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD())"
     ".get_scaled_loss(tf.constant(1.0))", ".get_scaled_loss()"),
    ("tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD())"
     ".get_unscaled_gradients([tf.constant(1.0)])", ".get_unscaled_gradients()"),
]
GONE = [
    ("tf.keras.mixed_precision.experimental.Policy('float32')",
     "tf.keras.mixed_precision.experimental.Policy"),
    ("tf.distribute.get_strategy().experimental_run_v2(lambda: 1)", ".experimental_run_v2()"),
    ("model().predict_classes(np.zeros((1, 2)))", ".predict_classes()"),
    ("tf.keras.wrappers.scikit_learn.KerasClassifier",
     "tf.keras.wrappers.scikit_learn.KerasClassifier"),
    ("tf.keras.backend.get_session()", ".get_session()"),
]
# What Keras 3 refuses and tf_keras runs, found by the rules of launcher/keras_3_breaks.py
# (snippet, the API a finding on its line shows): files a save, checkpoint or load names,
# keywords and names Keras 3's tf.keras lacks, integer shapes, `optimizer.lr`.
KERAS_3_REFUSES = [
    ("model().save('/tmp/mgpu-scan-model')", "model().save('/tmp/mgpu-scan-model')"),
    ("model().save('/tmp/mgpu-scan-sm', save_format='tf')",
     "model().save('/tmp/mgpu-scan-sm', save_format='tf')"),
    ("tf.keras.models.save_model(model(), '/tmp/mgpu-scan-fn')",
     "tf.keras.models.save_model(model(), '/tmp/mgpu-scan-fn')"),
    ("model().save_weights('/tmp/mgpu-scan-weights')",
     "model().save_weights('/tmp/mgpu-scan-weights')"),
    ("model().save_weights('/tmp/mgpu-scan-w.h5')", "model().save_weights('/tmp/mgpu-scan-w.h5')"),
    ("tf.keras.callbacks.ModelCheckpoint('/tmp/mgpu-scan-ckpt', save_weights_only=True)",
     "tf.keras.callbacks.ModelCheckpoint('/tmp/mgpu-scan-ckpt', save_weights_only=True)"),
    ("tf.keras.callbacks.ModelCheckpoint(filepath='/tmp/mgpu-scan/ckpt-{epoch}')",
     "tf.keras.callbacks.ModelCheckpoint(filepath='/tmp/mgpu-scan/ckpt-{epoch}')"),
    ("m = model(); m.save('/tmp/mgpu-scan-sm2'); tf.keras.models.load_model('/tmp/mgpu-scan-sm2')",
     "tf.keras.models.load_model('/tmp/mgpu-scan-sm2')"),
    ("m = model(); m.save_weights('/tmp/mgpu-scan-lw'); m.load_weights('/tmp/mgpu-scan-lw')",
     "m.load_weights('/tmp/mgpu-scan-lw')"),
    ("tf.keras.Input(500)", "Input(500)"),
    ("tf.keras.Input(shape=500)", "Input(500)"),
    ("tf.keras.layers.InputLayer(input_shape=500)", "InputLayer(500)"),
    ("model().fit(np.zeros((4, 2)), np.zeros((4, 1)), workers=2, verbose=0)",
     ".fit(workers=...)"),
    ("model().fit(np.zeros((4, 2)), np.zeros((4, 1)), use_multiprocessing=True, verbose=0)",
     ".fit(use_multiprocessing=...)"),
    ("model().evaluate(np.zeros((4, 2)), np.zeros((4, 1)), max_queue_size=2, verbose=0)",
     ".evaluate(max_queue_size=...)"),
    ("model().train_on_batch(np.zeros((4, 2)), np.zeros((4, 1)), reset_metrics=False)",
     ".train_on_batch(reset_metrics=...)"),
    ("m = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)]); "
     "m.compile('sgd', 'mse', sample_weight_mode='temporal')",
     ".compile(sample_weight_mode=...)"),
    ("optimizer = tf.keras.optimizers.SGD(0.1); optimizer.lr", "optimizer.lr"),
    ("m = model(); m.optimizer.lr", "m.optimizer.lr"),
    ("tf.keras.backend.learning_phase()", "tf.keras.backend.learning_phase"),
    ("from tensorflow.keras import backend as K; K.manual_variable_initialization(False)",
     "K.manual_variable_initialization"),
    ("tf.keras.layers.LocallyConnected2D(2, 3)", "tf.keras.layers.LocallyConnected2D"),
    ("tf.keras.losses.mean_squared_error(np.zeros(2), np.zeros(2))",
     "tf.keras.losses.mean_squared_error"),
    ("tf.keras.constraints.RadialConstraint()", "tf.keras.constraints.RadialConstraint"),
    ("tf.keras.layers.LSTM(2, time_major=True)", "LSTM(time_major=...)"),
    ("tf.keras.layers.BatchNormalization(fused=True)", "BatchNormalization(fused=...)"),
    ("tf.keras.layers.Dense(1, dynamic=True)", "Dense(dynamic=...)"),
    ("tf.keras.layers.Layer().add_weight('w', (2,))", ".add_weight('name', ...)"),
    ("optimizer = tf.keras.optimizers.SGD(); v = tf.Variable(1.0); "
     "optimizer.minimize(lambda: v * v, [v])", ".minimize()"),
    ("tf.keras.callbacks.experimental.BackupAndRestore('/tmp/mgpu-scan-backup')",
     "tf.keras.callbacks.experimental.BackupAndRestore"),
    ("tf.compat.v1.layers.Dense(2)", "tf.compat.v1.layers.Dense"),
]
# Keras 2 code the scan cannot see (a dtype's name, a TF op on a symbolic tensor), which the
# failure note recognises after Keras 3 raised.
SEEN_ONLY_WHEN_IT_FAILS = [
    "tf.keras.layers.Dense(2)(tf.keras.Input((3,))).dtype.name",
    "tf.nn.relu(tf.keras.Input((3,)))",
    "import tf_keras; tf.keras.Sequential([tf_keras.layers.Dense(1)])",
]


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # files are shown relative to the working folder


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize(("snippet", "api"), KERAS_2_ONLY)
def test_each_keras_2_api_is_found_with_its_line(tmp_path: Path, snippet: str, api: str) -> None:
    path = write(tmp_path, "train.py", PRELUDE + snippet + "\n")
    scan = scan_script(path)
    assert [(f.api, f.line) for f in scan.keras_2] == [(api, PRELUDE.count("\n") + 1)]
    assert scan.removed == () and scan.keras_2_evidence() is not None
    assert f"`{api}` at " in scan.keras_2_evidence()  # type: ignore[operator]


@pytest.mark.parametrize(("snippet", "api"), GONE)
def test_each_removed_api_gets_a_note_with_its_replacement(
    tmp_path: Path, snippet: str, api: str
) -> None:
    path = write(tmp_path, "train.py", PRELUDE + snippet + "\n")
    scan = scan_script(path)
    assert [finding.api for finding in scan.removed] == [api]
    assert scan.keras_2_evidence() is None  # Keras 2 would not help
    (note,) = scan.notes()
    # Keras' own removals say what replaces them; TensorFlow's say their release and fix.
    assert ("gone from TensorFlow 2.21" in note and "use " in note) or (
        "TensorFlow 2." in note and "Fix: " in note)


@pytest.mark.parametrize(("snippet", "api"), KERAS_3_REFUSES)
def test_each_keras_3_break_is_found_with_its_line_and_why(
    tmp_path: Path, snippet: str, api: str
) -> None:
    path = write(tmp_path, "train.py", PRELUDE + snippet + "\n")
    scan = scan_script(path)
    line = PRELUDE.count("\n") + 1
    found = {finding.api: finding for finding in scan.keras_2}
    assert api in found and found[api].line == line, scan.keras_2
    assert found[api].why.startswith(("Keras 3", "tf.compat.v1")), found[api].why
    assert scan.keras_2_evidence() is not None and scan.removed == ()
    assert scan.keras_2_why() is not None and ": " in scan.keras_2_why()  # type: ignore[operator]


# Code that looks like a break and is not one (Keras 3 runs it, or it is not Keras at all),
# and paths the source does not fix: the scan finds nothing.
NOT_BREAKS = [
    "model().save('m.keras')", "model().save('m.h5')", "model().save('m.hdf5')",
    "model().save('m.keras', save_format='keras')", "model().save(args.out)",
    "model().save_weights('w.weights.h5')", "model().save(f'{folder}/{name}')",
    "tf.keras.callbacks.ModelCheckpoint('best.h5')",
    "tf.keras.callbacks.ModelCheckpoint(f'{folder}/ckpt-{{epoch}}.keras')",
    "tf.keras.callbacks.ModelCheckpoint('w.weights.h5', save_weights_only=True)",
    "tf.keras.models.load_model('m.keras')", "model().load_weights(tf.train.latest_checkpoint(d))",
    "np.save('array', np.zeros(2))", "image.save('picture.png')", "save('run')",
    "checkpoint.save('./training_checkpoints/ckpt')", "manager.save()",
    "tf.saved_model.save(model(), 'exported')", "model().export('exported')",
    "tf.keras.Input(shape=(500,))", "tf.keras.layers.Dense(1, input_shape=(500,))",
    "optimizer.learning_rate", "args.lr", "model().fit(x, y, epochs=2)",
    "sklearn_model.fit(x, y)", "tf.keras.backend.clear_session()",
    "tf.keras.backend.int_shape(x)", "tf.keras.losses.MeanSquaredError()",
    "scipy.optimize.minimize(f, x0)",
]


@pytest.mark.parametrize("snippet", NOT_BREAKS)
def test_keras_3_code_and_other_libraries_calls_are_not_breaks(
    tmp_path: Path, snippet: str
) -> None:
    path = write(tmp_path, "train.py", PRELUDE + snippet + "\n")
    assert scan_script(path).keras_2 == ()


def test_a_path_is_followed_through_names_joins_and_formats(tmp_path: Path) -> None:
    path = write(tmp_path, "train.py", PRELUDE + (
        "checkpoint_dir = './training_checkpoints'\n"
        "checkpoint_prefix = os.path.join(checkpoint_dir, 'ckpt_{epoch}')\n"
        "tf.keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, "
        "save_weights_only=True)\n"
        "model().save(checkpoint_dir + '/final')\n"
        "model().save(pathlib.Path('out') / 'model')\n"
        "model().save('runs/{}'.format(3))\n"
        "twice = 'a.keras'\n"
        "twice = 'b'\n"
        "model().save(twice)\n"
    ))
    lines = [finding.line for finding in scan_script(path).keras_2]
    start = PRELUDE.count("\n")
    assert lines == [start + 3, start + 4, start + 5], lines  # `twice`: bound twice, unknown


def test_the_scan_knows_whether_the_script_uses_tf_keras(tmp_path: Path) -> None:
    uses = {
        "import tensorflow as tf\nm = tf.keras.Sequential()\n": 2,
        "from tensorflow import keras\n": 1,
        "from tensorflow.keras import layers\n": 1,
        "import tensorflow.keras.backend as K\n": 1,
    }
    for source, line in uses.items():
        found = scan_script(write(tmp_path, "uses.py", source)).tf_keras_use
        assert found is not None and found.line == line, source
    for source in ("import keras\nkeras.Sequential()\n", "import tensorflow as tf\n"
                   "tf.constant(1)\n", "import torch\n"):
        assert scan_script(write(tmp_path, "other.py", source)).tf_keras_use is None, source


def test_plain_keras_3_code_finds_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, "train.py", PRELUDE + (
        "m = tf.keras.metrics.Mean(); m.reset_state()\n"
        "opt = tf.keras.optimizers.Adam(learning_rate=0.1)\n"
        "tf.keras.layers.Rescaling(1 / 255)\n"
        "model().fit(batches(), steps_per_epoch=1)\n"
    ))
    scan = scan_script(path)
    assert scan.keras_2 == () and scan.removed == () and scan.notes() == []
    assert scan.keras_2_evidence() is None and scan.apply_gradients is None


def test_local_modules_are_read_and_installed_packages_are_not(tmp_path: Path) -> None:
    write(tmp_path, "code/train.py",
          "import numpy\nimport helpers\nfrom pkg import steps\nfrom .sibling import x\n")
    write(tmp_path, "code/helpers.py", "from tensorflow.keras.optimizers.legacy import Adam\n")
    write(tmp_path, "code/pkg/__init__.py", "")
    write(tmp_path, "code/pkg/steps.py", "from . import inner\n")
    write(tmp_path, "code/pkg/inner.py", "\n\nmetric.reset_states()\n")
    scan = scan_script(tmp_path / "code" / "train.py")
    found = {(Path(f.path).name, f.line, f.api) for f in scan.keras_2}
    assert found == {("helpers.py", 1, "tensorflow.keras.optimizers.legacy"),
                     ("inner.py", 3, ".reset_states()")}
    assert not any("numpy" in name for name in scan.files)


def test_keras_2_code_that_imports_keras_3_itself_is_not_switched_and_says_how(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "train.py", "import keras\nfrom keras.optimizers.legacy import SGD\n")
    scan = scan_script(path)
    assert scan.keras_2 and scan.keras_2_evidence() is None
    (note,) = scan.notes()
    assert "`import keras` at train.py:1 imports Keras 3 itself" in note
    assert "`import tf_keras as keras` there, and KERAS=2" in note
    # `from tensorflow import keras` is tf.keras: it is switched.
    tf_keras = write(tmp_path, "tf.py", "from tensorflow import keras\nkeras.metrics.Mean()"
                                        ".reset_states()\n")
    assert scan_script(tf_keras).keras_2_evidence() == "`.reset_states()` at tf.py:2"


def test_a_custom_loop_without_loss_scaling_and_a_policy_of_its_own(tmp_path: Path) -> None:
    loop = "optimizer.apply_gradients(zip(grads, model.trainable_variables))\n"
    path = write(tmp_path, "train.py", "import tensorflow as tf\n"
                 "tf.keras.mixed_precision.set_global_policy('mixed_float16')\n" + loop)
    scan = scan_script(path)
    assert scan.unscaled_custom_loop() is not None
    assert scan.unscaled_custom_loop().where == "train.py:3"  # type: ignore[union-attr]
    assert scan.sets_policy is not None and scan.sets_policy.line == 2
    scaled = write(tmp_path, "scaled.py", "from tensorflow.keras import mixed_precision\n"
                   "optimizer = mixed_precision.LossScaleOptimizer(optimizer)\n" + loop)
    assert scan_script(scaled).unscaled_custom_loop() is None


def test_a_file_that_does_not_parse_is_listed_not_raised(tmp_path: Path) -> None:
    write(tmp_path, "helper.py", "def broken(:\n")
    path = write(tmp_path, "train.py", "import helper\nm.reset_states()\n")
    scan = scan_script(path)
    assert scan.unreadable == ("helper.py",) and scan.keras_2[0].line == 2


def test_the_scan_follows_at_most_max_files_and_takes_milliseconds(tmp_path: Path) -> None:
    for index in range(MAX_FILES + 10):
        write(tmp_path, f"m{index}.py", f"import m{index + 1}\n" + PRELUDE * 5)
    started = time.perf_counter()
    scan = scan_script(tmp_path / "m0.py")
    took = time.perf_counter() - started
    assert len(scan.files) == MAX_FILES
    assert took < 2.0, took  # ~64 small files: tens of milliseconds on a busy CPU


CHECK_EACH = """\
import json, os, sys
from mgpu_env.runtime.keras import keras_2_error
prelude, snippets = json.load(open(sys.argv[1]))
results = {}
for snippet in snippets:
    space = {}
    try:
        exec(prelude + snippet, space)
    except Exception as err:
        results[snippet] = ["failed", keras_2_error(err), f"{type(err).__name__}: {err}"[:300]]
    else:
        results[snippet] = ["ran", None, ""]
print("RESULTS " + json.dumps(results))
"""


def run_each(tmp_path: Path, legacy: str) -> dict[str, list]:
    snippets = ([s for s, _ in KERAS_2_ONLY] + [s for s, _ in GONE]
                + [s for s, _ in KERAS_3_REFUSES] + SEEN_ONLY_WHEN_IT_FAILS)
    data = write(tmp_path, "snippets.json", json.dumps([PRELUDE, snippets]))
    script = write(tmp_path, "check.py", CHECK_EACH)
    env = child_env(tmp_path, TF_USE_LEGACY_KERAS=legacy, TF_CPP_MIN_LOG_LEVEL="3",
                    CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(script), str(data)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert lines, done.stderr[-3000:]
    return json.loads(lines[-1][8:])


@pytest.mark.slow
def test_the_catalogue_is_what_keras_3_and_tf_keras_really_do(tmp_path: Path) -> None:
    keras_3 = run_each(tmp_path, "0")
    keras_2 = run_each(tmp_path, "1")
    for snippet, _ in KERAS_2_ONLY:
        outcome, cause, text = keras_3[snippet]
        assert outcome == "failed" and cause is not None, (snippet, text)
        assert keras_2[snippet][0] == "ran", (snippet, keras_2[snippet])
    for snippet, _ in GONE:
        assert keras_3[snippet][0] == "failed" and keras_2[snippet][0] == "failed", snippet
    for snippet, _ in KERAS_3_REFUSES:  # the rule, not an error string: Keras 3 refuses
        assert keras_3[snippet][0] == "failed", (snippet, keras_3[snippet])
        assert keras_2[snippet][0] == "ran", (snippet, keras_2[snippet])
    for snippet in SEEN_ONLY_WHEN_IT_FAILS:
        outcome, cause, text = keras_3[snippet]
        assert outcome == "failed" and cause is not None, (snippet, text)
        assert keras_2[snippet][0] == "ran", (snippet, keras_2[snippet])


def test_a_module_run_reads_the_package_from_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_env import launcher

    # resolve_target puts the working folder first on sys.path and imports the package.
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))

    write(tmp_path, "trainer/__init__.py", "")
    write(tmp_path, "trainer/__main__.py", "from trainer import steps\n")
    write(tmp_path, "trainer/steps.py", "optimizer = tf.keras.optimizers.Adam(lr=1e-3)\n")
    scan = launcher.scan_target(launcher.resolve_target(["trainer"], module=True))
    assert scan.keras_2_evidence() == "`Adam(lr=...)` at trainer/steps.py:1"


def test_a_package_built_on_keras_3_keeps_keras_3(tmp_path: Path) -> None:
    path = write(tmp_path, "train.py", "import keras_hub\nimport tensorflow as tf\n"
                                       "tf.keras.metrics.Mean().reset_states()\n")
    scan = scan_script(path)
    assert scan.keras_2_evidence() is None
    assert "`import keras_hub` at train.py:1 imports Keras 3 itself" in scan.notes()[0]


TABLES = """\
import inspect, json, sys
import tensorflow as tf
import tf_keras
from mgpu_env.launcher.keras_3_breaks import COMPARED_MODULES
names = {}
for module in COMPARED_MODULES:
    old, new = tf_keras, tf.keras
    for part in module.split("."):
        old, new = getattr(old, part), getattr(new, part)
    gone = sorted(n for n in dir(old) if not n.startswith("_")
                  and not inspect.ismodule(getattr(old, n)) and not hasattr(new, n))
    if gone:
        names[module] = gone
keywords = {}
for method in ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "save_weights",
               "load_weights", "compile"):
    old = set(inspect.signature(getattr(tf_keras.Model, method)).parameters)
    new = set(inspect.signature(getattr(tf.keras.Model, method)).parameters)
    keywords[method] = sorted(old - new - {"kwargs"})
print("TABLES " + json.dumps([tf.keras.__name__, names, keywords]))
"""


@pytest.mark.slow
def test_the_tables_are_the_difference_between_the_two_keras(tmp_path: Path) -> None:
    """KERAS_2_ONLY_NAMES is exactly what tf_keras has and Keras 3's tf.keras lacks, module by
    module; KERAS_2_ONLY_KEYWORDS holds every keyword Model's signatures lost (compile's
    sample_weight_mode and experimental_steps_per_execution went through **kwargs: the
    catalogue above runs them)."""
    from mgpu_env.launcher.keras_3_breaks import KERAS_2_ONLY_KEYWORDS, KERAS_2_ONLY_NAMES

    script = write(tmp_path, "tables.py", TABLES)
    env = child_env(tmp_path, TF_USE_LEGACY_KERAS="0", TF_CPP_MIN_LOG_LEVEL="3",
                    CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("TABLES ")]
    assert lines, done.stderr[-3000:]
    keras_name, names, keywords = json.loads(lines[-1][7:])
    assert keras_name.startswith("keras"), keras_name  # Keras 3's tf.keras, not tf_keras
    assert {m: sorted(n) for m, n in KERAS_2_ONLY_NAMES.items()} == names
    for method, lost in keywords.items():
        assert set(lost) <= KERAS_2_ONLY_KEYWORDS.get(method, frozenset()), (method, lost)
    assert {m for m, lost in keywords.items() if lost} == set(KERAS_2_ONLY_KEYWORDS)
