"""KERAS: which Keras `tf.keras` is, decided once in the runtime (no TensorFlow here)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mgpu_env import launcher
from mgpu_env.config.errors import ConfigError
from mgpu_env.doctor.checks import check_keras
from mgpu_env.doctor.facts import KerasFacts
from mgpu_env.launcher import ScriptFailure
from mgpu_env.launcher.source_scan import ScriptScan, scan_script
from mgpu_env.runtime import Execution
from mgpu_env.runtime.keras import KerasChoice, KerasFound, choose_keras
from tests.support.runtimes import runtime_of

HOSTS = {"WORKER_HOSTS": "127.0.0.1:2222,127.0.0.1:2223", "WORKER_INDEX": "0",
         "GPUS": "none"}


def choose(request: str = "auto", *, multi_worker: bool = True, command: str = "run",
           user_legacy: str | None = None, installed: bool = True,
           keras_2_code: str | None = None) -> KerasChoice:
    return choose_keras(request,  # type: ignore[arg-type]
                        KerasFound(user_legacy, installed, keras_2_code),
                        multi_worker=multi_worker, command=command)  # type: ignore[arg-type]


def test_auto_gives_a_script_between_workers_keras_2_and_says_why() -> None:
    choice = choose()
    assert choice.version == "2" and "keras-team/keras#20585" in choice.reason
    assert choice.environment(None) == {"TF_USE_LEGACY_KERAS": "1"}


@pytest.mark.parametrize(("multi_worker", "command"),
                         [(False, "run"), (True, "train"), (True, "bench"), (False, "train")])
def test_auto_keeps_keras_3_on_one_machine_and_for_mgpus_own_loop(
    multi_worker: bool, command: str
) -> None:
    choice = choose(multi_worker=multi_worker, command=command)
    assert choice.version == "3" and choice.notes == () and choice.environment(None) == {}


def test_auto_between_workers_without_tf_keras_stays_on_keras_3_with_the_fix() -> None:
    choice = choose(installed=False)
    assert choice.version == "3"
    assert "pip install 'tf-keras==2.21.*'" in choice.notes[0]


def test_keras_2_without_tf_keras_is_an_error_with_the_fix() -> None:
    with pytest.raises(ConfigError) as raised:
        choose("2", multi_worker=False, installed=False)
    message = str(raised.value)
    assert "KERAS=2" in message and "tf_keras package is not installed" in message
    assert "Fix: pip install 'tf-keras==2.21.*'" in message


@pytest.mark.parametrize(("user", "version"), [("1", "2"), ("true", "2"), ("0", "3")])
def test_auto_follows_the_users_own_tf_use_legacy_keras(user: str, version: str) -> None:
    choice = choose(multi_worker=False, user_legacy=user)
    assert choice.version == version and f"TF_USE_LEGACY_KERAS={user}" in choice.reason


def test_the_users_tf_use_legacy_keras_0_between_workers_gets_a_note() -> None:
    choice = choose(user_legacy="0")
    assert choice.version == "3" and "unset it" in choice.notes[0]


def test_an_explicit_keras_wins_over_tf_use_legacy_keras_with_a_note() -> None:
    three = choose("3", multi_worker=False, user_legacy="1")
    assert three.version == "3" and three.environment("1") == {"TF_USE_LEGACY_KERAS": "0"}
    assert "KERAS=3 overrides TF_USE_LEGACY_KERAS=1" in three.notes
    two = choose("2", multi_worker=False, user_legacy="0")
    assert two.version == "2" and two.environment("0") == {"TF_USE_LEGACY_KERAS": "1"}
    assert "KERAS=2 overrides TF_USE_LEGACY_KERAS=0" in two.notes


def test_the_runtime_decides_it_once_and_it_travels_to_children_as_json() -> None:
    runtime = runtime_of(HOSTS, command="run")
    assert runtime.keras.version == "2"
    assert runtime.environment["TF_USE_LEGACY_KERAS"] == "1"
    again = Execution.from_json(runtime.execution.to_json())
    assert again == runtime.execution
    trained = runtime_of(HOSTS, command="train")
    assert trained.keras.version == "3" and "TF_USE_LEGACY_KERAS" not in trained.environment


def test_the_settings_files_tf_use_legacy_keras_counts_as_the_users(tmp_path: Path) -> None:
    from mgpu_env.config.resolve import resolve_settings

    env_file = tmp_path / "settings.env"
    env_file.write_text("TF_USE_LEGACY_KERAS=1\nGPUS=none\n")
    resolved = resolve_settings({"ENV_FILE": str(env_file)}, {})
    runtime = runtime_of(resolved, command="run")
    assert runtime.keras.version == "2" and "your TF_USE_LEGACY_KERAS=1" in runtime.keras.reason


def test_mgpu_runs_start_line_names_the_keras_and_why() -> None:
    runtime = runtime_of(HOSTS, command="run")
    target = launcher.Target("train.py", False, (), Path("train.py"))
    lines = launcher.summary(runtime, target)
    assert lines[0].endswith("tf.keras Keras 2 (tf_keras)")
    assert any(line.startswith("  keras: KERAS=auto between workers") for line in lines)


def _raise_in_keras_3() -> BaseException:
    """An error raised from a frame inside Keras 3's package, as model.fit's would be."""
    import keras

    try:
        keras.ops.convert_to_tensor(object())
    except Exception as err:
        return err
    raise AssertionError("no error")


TARGET = launcher.Target("train.py", False, ("--epochs", "2"), Path("train.py"))


def note(err: BaseException, keras: KerasChoice, *, cluster: bool = True,
         modules: object = None) -> str | None:
    failure = ScriptFailure(err, sys.modules if modules is None else modules)  # type: ignore[arg-type]
    return launcher.keras_note(failure, keras, TARGET, cluster=cluster)


def test_a_keras_3_error_between_workers_gets_the_note(logical_cpus: tuple[str, ...]) -> None:
    # A Keras metric starts TensorFlow's devices in this process: split them first.
    import keras

    err = _raise_in_keras_3()
    imported = note(err, choose())
    assert imported is not None and "the script imported Keras 3 (`import keras`)" in imported
    assert "`import tf_keras as keras`" in imported and "keras-team/keras#20585" in imported
    # An error of the script's own (not in Keras) gets no note.
    assert note(FileNotFoundError("data.csv"), choose()) is None
    # Keras 3's metrics lack reset_states (the custom-loop tutorial's failure).
    metric = keras.metrics.Mean()
    with pytest.raises(AttributeError) as missing:
        metric.reset_states()
    assert note(missing.value, choose()) is not None
    assert note(err, choose(), modules={"keras": SimpleNamespace(__version__="2.15")}) is None
    # tf.keras is Keras 3 between workers (KERAS=3): rerun with KERAS=2.
    rerun = note(err, choose("3"))
    assert rerun is not None and "keras-team/keras#20585" in rerun
    assert rerun.endswith("KERAS=2 mgpu run train.py --epochs 2")


def test_keras_2_code_failing_in_keras_3_on_one_machine_ends_with_the_rerun_command(
    logical_cpus: tuple[str, ...],
) -> None:
    import keras

    one_machine = choose(multi_worker=False)
    assert one_machine.version == "3"
    with pytest.raises(AttributeError) as missing:
        keras.metrics.Mean().reset_states()
    got = note(missing.value, one_machine, cluster=False)
    assert got is not None and "reset_state(), not reset_states()" in got
    assert got.splitlines()[-1].endswith("KERAS=2 mgpu run train.py --epochs 2")
    # The script's own errors, and Keras 3's own complaints about Keras 3 code, get none.
    assert note(FileNotFoundError("data.csv"), one_machine, cluster=False) is None
    assert note(_raise_in_keras_3(), one_machine, cluster=False) is None
    # A module run spells -m.
    module = launcher.Target("pkg.train", True, (), Path("pkg/train.py"))
    got = launcher.keras_note(ScriptFailure(missing.value, sys.modules), one_machine, module,
                              cluster=False)
    assert got is not None and got.endswith("KERAS=2 mgpu run -m pkg.train")


def test_keras_2_code_found_in_the_source_gets_keras_2_with_the_reason() -> None:
    code = "`.reset_states()` at train.py:40"
    choice = choose(multi_worker=False, keras_2_code=code)
    assert choice.version == "2" and code in choice.reason
    assert choice.environment(None) == {"TF_USE_LEGACY_KERAS": "1"}
    # Without tf_keras: Keras 3 and the fix; the user's own choices win.
    missing = choose(multi_worker=False, keras_2_code=code, installed=False)
    assert missing.version == "3" and "pip install 'tf-keras==2.21.*'" in missing.notes[0]
    assert choose(multi_worker=False, keras_2_code=code, user_legacy="0").version == "3"
    three = choose("3", multi_worker=False, keras_2_code=code)
    assert three.version == "3" and code in three.notes[0]
    # mgpu's own loop is never switched.
    assert choose(multi_worker=False, command="train", keras_2_code=code).version == "3"


def test_the_doctor_says_which_keras_a_run_gets() -> None:
    facts = SimpleNamespace(keras=KerasFacts(choose(), choose(command="train")))
    check = check_keras(facts)  # type: ignore[arg-type]
    assert check.status == "ok"
    assert check.found.startswith("mgpu run: Keras 2 (tf_keras)")
    assert "mgpu train: Keras 3" in check.found
    with pytest.raises(ConfigError) as raised:
        choose("2", installed=False)
    bad = check_keras(SimpleNamespace(keras=KerasFacts(error=str(raised.value))))  # type: ignore[arg-type]
    assert bad.status == "error" and bad.bad_setting and "pip install" in bad.fix


def test_only_keras_3_that_auto_fell_back_to_counts_as_chosen_by_default() -> None:
    assert choose(multi_worker=False).by_default  # auto, nothing asked, tf_keras installed
    assert not choose("3", multi_worker=False).by_default  # asked for
    assert not choose(multi_worker=False, user_legacy="0").by_default  # the user's own
    assert not choose(multi_worker=False, installed=False).by_default  # KERAS=2 would fail
    assert not choose(multi_worker=False, command="train").by_default  # mgpu's own loop
    assert not choose().by_default  # Keras 2 between workers


def scanned(tmp_path: Path, source: str) -> ScriptScan:
    path = tmp_path / "train.py"
    path.write_text(source)
    return scan_script(path)


def test_any_error_of_a_tf_keras_script_under_default_keras_3_ends_with_keras_2(
    tmp_path: Path,
) -> None:
    one_machine = choose(multi_worker=False)
    tf_code = scanned(tmp_path, "import tensorflow as tf\nmodel = tf.keras.Sequential()\n")
    got = launcher.keras_note(ScriptFailure(KeyError("a wording no list holds"), {}),
                              one_machine, TARGET, cluster=False, scan=tf_code)
    assert got is not None and len(got.splitlines()) == 1
    assert "the script is tf.keras code (`tf.keras.Sequential` at " in got
    assert "train.py:2) and failed under Keras 3, which KERAS=auto chose" in got
    assert got.endswith("Fix: rerun with Keras 2 (tf_keras): KERAS=2 mgpu run train.py "
                        "--epochs 2")
    # Keras 3 asked for (KERAS=3 or TF_USE_LEGACY_KERAS=0): the script's own error stays its.
    for asked in (choose("3", multi_worker=False), choose(multi_worker=False, user_legacy="0")):
        assert launcher.keras_note(ScriptFailure(FileNotFoundError("x"), {}), asked, TARGET,
                                   cluster=False, scan=tf_code) is None
    # A script that is not tf.keras code gets nothing.
    plain = scanned(tmp_path, "import tensorflow as tf\nx = tf.constant(1)\n")
    assert launcher.keras_note(ScriptFailure(FileNotFoundError("x"), {}), one_machine, TARGET,
                               cluster=False, scan=plain) is None


def test_a_failure_no_keras_can_have_caused_gets_no_keras_2_advice(
    tmp_path: Path, logical_cpus: tuple[str, ...],
) -> None:
    import tensorflow as tf

    one_machine = choose(multi_worker=False)
    tf_code = scanned(tmp_path, "import tensorflow as tf\nmodel = tf.keras.Sequential()\n")

    def raised(action: Any) -> BaseException:
        try:
            action()
        except BaseException as err:  # the error as the script meets it
            return err
        raise AssertionError("nothing raised")

    def read_own_file() -> None:
        with open(tmp_path / "train.csv") as rows:
            rows.read()

    own_file = raised(read_own_file)
    missing = raised(lambda: __import__("tensorflow_addons"))
    # An OSError raised inside TensorFlow (its file functions) may be Keras' doing.
    in_tensorflow = raised(lambda: tf.io.read_file(str(tmp_path / "nowhere")))
    legacy = raised(lambda: __import__("tensorflow.keras.optimizers.legacy_gone"))
    for err in (own_file, missing):
        assert launcher.keras_note(ScriptFailure(err, {}), one_machine, TARGET, cluster=False,
                                   scan=tf_code) is None, err
    for err in (in_tensorflow, legacy):
        assert "KERAS=2 mgpu run" in (launcher.keras_note(
            ScriptFailure(err, {}), one_machine, TARGET, cluster=False, scan=tf_code) or ""), err


def test_a_script_that_imports_keras_3_itself_is_not_told_to_rerun_with_keras_2(
    tmp_path: Path,
) -> None:
    own_keras = scanned(tmp_path, "import keras\nimport tensorflow as tf\n"
                                  "m = tf.keras.Sequential()\n")
    known = AttributeError("'Mean' object has no attribute 'reset_states'")
    assert launcher.keras_note(ScriptFailure(known, {}), choose(multi_worker=False), TARGET,
                               cluster=False, scan=own_keras) is None
    assert launcher.keras_note(ScriptFailure(ValueError("x"), {}), choose(multi_worker=False),
                               TARGET, cluster=False, scan=own_keras) is None


def test_the_start_summary_says_why_keras_3_would_fail_on_the_scripts_code(
    tmp_path: Path,
) -> None:
    scan = scanned(tmp_path, "import tensorflow as tf\nm = tf.keras.Sequential()\n"
                             "m.save('saved_model/my_model')\n")
    runtime = runtime_of(HOSTS, command="run")
    target = launcher.Target("train.py", False, (), Path("train.py"))
    lines = launcher.summary(runtime, target, scan)
    (why,) = [line for line in lines if line.startswith("  keras 2 code: ")]
    assert why.endswith("train.py:3: Keras 3 saves a model only to a .keras or .h5 file, not "
                        "a SavedModel folder (model.export() writes one)"), why
    # A script that imports Keras 3 itself: its note, not this line.
    own = scanned(tmp_path, "import keras\nimport tensorflow as tf\n"
                            "tf.keras.Sequential().save('saved_model/my_model')\n")
    assert not any(line.startswith("  keras 2 code: ")
                   for line in launcher.summary(runtime, target, own))
