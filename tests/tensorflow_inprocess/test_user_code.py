"""MODEL= and DATASET= hooks: the settings, the import, each contract and each mistake (exit 2).

In this process: the loaders return NumPy arrays (no TensorFlow runtime), and the builders
run on the CPU split into the same four logical devices as test_tensorflow_inprocess.py,
whichever of the two starts TensorFlow first.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.bench.models import bench_model, model_shape
from mgpu_env.bench.sweep import plan_devices, plan_points, run_bench
from mgpu_env.config.errors import ConfigError
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.config.settings import SettingsErrors
from mgpu_env.training.input.data import load_arrays, loader, resolve_dataset
from mgpu_env.training.run.identity import run_identity
from mgpu_env.training.step import user_code
from tests.support.runtimes import runtime_of

Write = Callable[[str, str], str]


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Write]:
    """Write a module in a folder on sys.path; returns its importable name. Forgotten after."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    written: list[str] = []

    def write(name: str, source: str) -> str:
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


# ------------------------------------------------------------------------------ settings


@pytest.mark.parametrize("value", ["mlp", "MLP", "pkg.models:build", "m:build_2"])
def test_model_takes_mlp_or_a_module_function(value: str) -> None:
    resolved = resolve_settings({"MODEL": value}, {})
    assert resolved.settings.model == (value.lower() if ":" not in value else value)


@pytest.mark.parametrize("value", ["cnn", "pkg.models:", ":build", "pkg..m:build", "a:b:c",
                                   "pkg/models.py:build"])
def test_model_refuses_other_values_with_the_valid_ones(value: str) -> None:
    with pytest.raises(SettingsErrors) as caught:
        resolve_settings({"MODEL": value}, {})
    message = str(caught.value)
    assert f"MODEL={value!r}" in message and "package.module:function" in message


def test_dataset_keeps_its_names_and_takes_a_loader() -> None:
    assert resolve_settings({"DATASET": "Digits"}, {}).settings.dataset == "digits"
    assert resolve_settings({"DATASET": "my.data:load"}, {}).settings.dataset == "my.data:load"
    choice = resolve_dataset("my.data:load", None, {})
    assert choice.origin == "hook" and "your loader" in choice.describe()
    with pytest.raises(SettingsErrors, match="DATASET='cifar'"):
        resolve_settings({"DATASET": "cifar"}, {})


def test_the_run_identity_names_the_model_only_when_it_is_a_builder() -> None:
    # Runs from before MODEL existed have no "model" in run.json and must still resume.
    plain = resolve_settings({}, {}).settings
    assert "model" not in run_identity(plain, "digits", "float32", 64)
    custom = resolve_settings({"MODEL": "m:build"}, {}).settings
    assert run_identity(custom, "digits", "float32", 64)["model"] == "m:build"


# -------------------------------------------------------------------------------- import


def test_a_missing_module_says_where_it_looked_and_the_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        user_code.import_hook("no_such_module_xyz:build", "MODEL", user_code.MODEL_CONTRACT)
    message = str(caught.value)
    assert "MODEL=no_such_module_xyz:build" in message and "no module" in message
    assert "PYTHONPATH" in message and "working folder" in message


def test_a_missing_dependency_of_the_module_is_named(user_module: Write) -> None:
    name = user_module("needs_dep", "import not_installed_dep_xyz\n")
    with pytest.raises(ConfigError, match="imports 'not_installed_dep_xyz'"):
        user_code.import_hook(f"{name}:build", "MODEL", user_code.MODEL_CONTRACT)


def test_an_error_while_importing_the_module_is_shown(user_module: Write) -> None:
    name = user_module("broken_mod", "x = 1 / 0\n")
    with pytest.raises(ConfigError, match="ZeroDivisionError"):
        user_code.import_hook(f"{name}:build", "MODEL", user_code.MODEL_CONTRACT)


def test_a_missing_or_uncallable_function_lists_what_there_is(user_module: Write) -> None:
    name = user_module("some_mod", """
        SIZE = 3
        def build_model(shape, classes): ...
        def other(): ...
    """)
    with pytest.raises(ConfigError) as caught:
        user_code.import_hook(f"{name}:build", "MODEL", user_code.MODEL_CONTRACT)
    assert "has no 'build'" in str(caught.value)
    assert "build_model, other" in str(caught.value)
    assert "build(input_shape, num_classes)" in str(caught.value)
    with pytest.raises(ConfigError, match="SIZE is a int, not a function"):
        user_code.import_hook(f"{name}:SIZE", "MODEL", user_code.MODEL_CONTRACT)


def test_the_working_folder_is_searched_like_python_dash_m(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cwd_hook_mod.py").write_text("def load():\n    return 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert user_code.import_hook("cwd_hook_mod:load", "DATASET", loader.DATA_CONTRACT)() == 1
    finally:
        sys.modules.pop("cwd_hook_mod", None)


# ------------------------------------------------------------------------------- DATASET


def test_a_loader_of_arrays_gives_the_data_its_shape_and_classes(user_module: Write) -> None:
    name = user_module("arrays_loader", """
        import numpy as np
        def load():
            rng = np.random.default_rng(0)
            x = rng.integers(0, 255, (100, 8, 8, 1)).astype("uint8")
            y = rng.integers(0, 3, 100)
            return (x[:80], y[:80]), (x[80:], y[80:].reshape(-1, 1).tolist())
    """)
    arrays = load_arrays(resolve_dataset(f"{name}:load", None, {}), seed=0)
    assert arrays.train_size == 80 and arrays.test_size == 20
    assert arrays.sample_shape == (8, 8, 1) and arrays.num_classes == 3
    assert arrays.x_train.dtype == np.float32 and arrays.y_test.dtype == np.int32
    assert arrays.y_test.shape == (20,)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("return None", "returned a NoneType"),
        ("return (1, 2, 3)", "returned a tuple of 3 items"),
        ("return x, x", "the train part is a ndarray"),
        ("return (x, y[:5]), (x, y)", "y_train has shape (5,) for 10 samples"),
        ("return (x, np.eye(10)[y]), (x, y)", "integer labels (not one-hot)"),
        ("return (x, y + 0.5), (x, y)", "expected integer class labels"),
        ("return (x, y - 1), (x, y)", "labels start at 0"),
        ("return (x, y), (x[:, :3], y)", "training samples have shape (4,) but test"),
        ("return (x[0], y), (x, y)", "x_train has shape (4,)"),
        ("raise RuntimeError('no disk')", "load() raised RuntimeError: no disk"),
    ],
)
def test_a_loader_that_breaks_the_contract_is_a_config_error(
    user_module: Write, body: str, expected: str
) -> None:
    name = user_module("bad_loader", f"""
        import numpy as np
        x = np.zeros((10, 4), dtype="float32")
        y = np.arange(10) % 3
        def load():
            {body}
    """)
    with pytest.raises(ConfigError) as caught:
        load_arrays(resolve_dataset(f"{name}:load", None, {}), seed=0)
    assert expected in str(caught.value)
    assert f"DATASET={name}:load" in str(caught.value)


def test_the_cli_refuses_a_bad_loader_with_exit_2(
    user_module: Write, tmp_path: Path, logical_cpus: tuple[str, ...]
) -> None:
    # The dry run prepares TensorFlow's devices before it calls a loader: split them first.
    name = user_module("cli_loader", "def load():\n    return 'data'\n")
    result = CliRunner().invoke(app, ["train", "--dry-run"], env={
        "GPUS": "none", "DATASET": f"{name}:load", "OUTPUT_DIR": str(tmp_path / "run")})
    assert result.exit_code == 2, result.output
    assert "returned a str" in result.stderr and "Expected: load() returning" in result.stderr
    assert "Traceback" not in result.output


def test_the_dry_run_shows_the_loaders_size_shape_and_the_builder(
    user_module: Write, tmp_path: Path, logical_cpus: tuple[str, ...]
) -> None:
    data = user_module("dry_loader", """
        import numpy as np
        def load():
            x = np.zeros((300, 6, 6), dtype="float32")
            y = np.arange(300) % 5
            return (x[:200], y[:200]), (x[200:], y[200:])
    """)
    # The dry run builds the model on the CPU: a real one, that fits the loader's data.
    model = user_module("dry_model", """
        import keras
        def build(input_shape, num_classes):
            return keras.Sequential([keras.Input(shape=input_shape), keras.layers.Flatten(),
                                     keras.layers.Dense(num_classes, activation="softmax")])
    """)
    result = CliRunner().invoke(app, ["train", "--dry-run"], env={
        "GPUS": "none", "DATASET": f"{data}:load", "MODEL": f"{model}:build",
        "BATCH_SIZE": "50", "OUTPUT_DIR": str(tmp_path / "run")})
    assert result.exit_code == 0, result.output
    assert f"{data}:load (your loader): 200 train, 100 test" in result.stdout
    assert f"{model}:build (your builder), input (6, 6), 5 classes" in result.stdout
    assert "4 steps per epoch" in result.stdout


def test_the_cli_refuses_a_builder_that_cannot_be_imported_before_training(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(app, ["train", "--dry-run"], env={
        "GPUS": "none", "DATASET": "digits", "MODEL": "nowhere_xyz.models:cnn",
        "OUTPUT_DIR": str(tmp_path / "run")})
    assert result.exit_code == 2, result.output
    assert "there is no module 'nowhere_xyz'" in result.stderr


# --------------------------------------------------------------------------------- MODEL


BUILDERS = """
import keras

def good(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    outputs = keras.layers.Dense(num_classes, activation="softmax")(x)
    return keras.Model(inputs, outputs)

def subclassed(input_shape, num_classes):
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(num_classes, activation="softmax")
        def call(self, x):
            return self.dense(keras.ops.reshape(x, (keras.ops.shape(x)[0], -1)))
    return Net()

def fixed_input(input_shape, num_classes):
    return keras.Sequential([keras.Input(shape=(10,)), keras.layers.Dense(num_classes)])

def three_classes(input_shape, num_classes):
    return keras.Sequential([keras.Input(shape=input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(3)])

def not_a_model(input_shape, num_classes):
    return [keras.layers.Dense(num_classes)]

def raises(input_shape, num_classes):
    raise ValueError("wrong layer")
"""


def test_a_good_builder_is_called_with_the_data_shape(
    user_module: Write, logical_cpus: tuple[str, ...]
) -> None:
    name = user_module("builders_ok", BUILDERS)
    model = user_code.build_model(f"{name}:good", (28, 28), 7)
    assert tuple(model.input_shape) == (None, 28, 28) and model.output_shape == (None, 7)
    # Subclassed models are built here, on one zero sample.
    assert user_code.build_model(f"{name}:subclassed", (4,), 2).built


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        ("fixed_input", "does not take the data's samples of shape (784,)"),
        ("three_classes", "expected (1, 10)"),
        ("not_a_model", "returned list, not a keras.Model"),
        ("raises", "raised ValueError: wrong layer"),
    ],
)
def test_a_builder_that_breaks_the_contract_is_a_config_error(
    user_module: Write, logical_cpus: tuple[str, ...], function: str, expected: str
) -> None:
    name = user_module("builders_bad", BUILDERS)
    with pytest.raises(ConfigError) as caught:
        user_code.build_model(f"{name}:{function}", (784,), 10)
    assert expected in str(caught.value) and f"MODEL={name}:{function}" in str(caught.value)


# --------------------------------------------------------------------------------- bench


def test_bench_measures_the_model_builder_on_mnist_shaped_samples() -> None:
    assert bench_model("pkg.m:build", "resnet") == "pkg.m:build"
    assert bench_model("mlp", "resnet") == "resnet"
    assert model_shape("pkg.m:build").input_shape == (784,)
    settings = resolve_settings({"MODEL": "pkg.m:build", "GPUS": "none",
                                 "VIRTUAL_DEVICES": "2"}, {}).settings
    runtime = runtime_of(settings)
    points = plan_points(settings, plan_devices(settings, runtime.selection, {}),
                         runtime.precision)
    assert {p.model for p in points} == {"pkg.m:build"}


def test_bench_refuses_a_builder_that_cannot_be_imported_before_any_child() -> None:
    settings = resolve_settings({"MODEL": "nowhere_xyz:build", "GPUS": "none"}, {}).settings

    def runner(spec: Any) -> dict[str, Any]:
        raise AssertionError("no child may start")

    with pytest.raises(ConfigError, match="no module 'nowhere_xyz'"):
        run_bench(runtime_of(settings), environ={}, runner=runner)
