"""The source scan of `mgpu run` (runtime/source_scan.py) and the Keras 2 failure notes.

The fast tests read sources only. The slow one runs every snippet of the catalogue in two
real processes, tf.keras = Keras 3 and tf.keras = tf_keras, and holds each entry to what
the code claims of it: Keras 2 only (fails in Keras 3 with an error the failure note
recognises, runs in tf_keras), or gone from both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mgpu_env.runtime.source_scan import MAX_FILES, scan_script

REPO = Path(__file__).resolve().parent.parent

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
# Keras 2 code the scan cannot see (a path in a variable, a dtype's name), which the failure
# note recognises after Keras 3 raised.
SEEN_ONLY_WHEN_IT_FAILS = [
    "model().save('/tmp/mgpu-scan-model')",
    "model().save_weights('/tmp/mgpu-scan-weights')",
    "tf.keras.callbacks.ModelCheckpoint('/tmp/mgpu-scan-ckpt', save_weights_only=True)",
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
    assert "gone from TensorFlow 2.21" in note and "use " in note


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
    snippets = [s for s, _ in KERAS_2_ONLY] + [s for s, _ in GONE] + SEEN_ONLY_WHEN_IT_FAILS
    data = write(tmp_path, "snippets.json", json.dumps([PRELUDE, snippets]))
    script = write(tmp_path, "check.py", CHECK_EACH)
    env = {**os.environ, "TF_USE_LEGACY_KERAS": legacy, "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
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
