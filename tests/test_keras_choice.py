"""KERAS: which Keras `tf.keras` is, decided once in the runtime (no TensorFlow here)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mgpu_env import launcher
from mgpu_env.config.errors import ConfigError
from mgpu_env.doctor.checks import check_keras
from mgpu_env.doctor.facts import KerasFacts
from mgpu_env.runtime import Execution
from mgpu_env.runtime.keras import KerasChoice, choose_keras
from tests.support.runtimes import runtime_of

HOSTS = {"WORKER_HOSTS": "127.0.0.1:2222,127.0.0.1:2223", "WORKER_INDEX": "0",
         "GPUS": "none"}


def choose(request: str = "auto", *, multi_worker: bool = True, command: str = "run",
           user_legacy: str | None = None, installed: bool = True) -> KerasChoice:
    return choose_keras(request, multi_worker=multi_worker, command=command,  # type: ignore[arg-type]
                        user_legacy=user_legacy, tf_keras_available=installed)


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


def test_a_keras_3_error_between_workers_gets_the_note() -> None:
    import keras

    err = _raise_in_keras_3()
    note = launcher.keras_3_note(err, sys.modules, choose())
    assert note is not None and "the script imported Keras 3 (`import keras`)" in note
    assert "`import tf_keras as keras`" in note
    # An error of the script's own (not in Keras) gets no note.
    assert launcher.keras_3_note(FileNotFoundError("data.csv"), sys.modules, choose()) is None
    # Keras 3's metrics lack reset_states (the custom-loop tutorial's failure).
    metric = keras.metrics.Mean()
    try:
        metric.reset_states()
    except AttributeError as missing:
        assert launcher.keras_3_note(missing, sys.modules, choose()) is not None
    assert launcher.keras_3_note(err, {"keras": SimpleNamespace(__version__="2.15")},
                                 choose()) is None


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
