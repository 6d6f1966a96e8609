"""`mgpu run` and the Python API, in this process: arguments, refusals (exit 2 before the
script starts), how the script is run (argv, sys.path, exit codes, tracebacks), and
`mgpu_env.strategy()`'s facts from a runtime. The real runs are in test_run_launcher.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env import api, launcher
from mgpu_env.config.errors import ConfigError
from mgpu_env.config.resolve import resolve_settings
from tests.support.children import REPO
from tests.support.runtimes import runtime_of


@pytest.fixture
def restore_sys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """run_target sets sys.argv and sys.path as Python would for the script."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    sys.modules.pop("user_pkg_xyz", None)
    sys.modules.pop("user_pkg_xyz.tool", None)


@pytest.fixture
def fresh_api() -> Iterator[None]:
    api._reset()
    yield
    api._reset()


def script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


# --------------------------------------------------------------------------------- CLI


def test_help_shows_script_args_and_the_settings() -> None:
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for text in ("SCRIPT [ARGS]...", "-m", "--gpus", "--virtual-devices", "--mixed-precision",
                 "--worker-hosts"):
        assert text in result.stdout


@pytest.mark.parametrize(
    ("env", "flags", "message"),
    [
        ({"VIRTUAL_DEVICES": "two"}, [], "VIRTUAL_DEVICES='two'"),
        ({}, ["--mixed-precision", "fp8"], "MIXED_PRECISION='fp8'"),
        ({"WORKER_HOSTS": "a:1,a:1"}, [], "WORKER_HOSTS"),
        ({"GPUS": "none", "VIRTUAL_DEVICES": "2", "CROSS_DEVICE_OPS": "nccl"}, [], "nccl"),
        # A parameter-server cluster is another strategy: said plainly, not "fix TF_CONFIG".
        ({"TF_CONFIG": '{"cluster": {"worker": ["a:1"], "ps": ["b:1"]}, '
                       '"task": {"type": "worker", "index": 0}}'}, [],
         '"ps" job, as a parameter-server cluster (ParameterServerStrategy) has; mgpu runs '
         "MultiWorkerMirroredStrategy clusters only"),
    ],
)
def test_bad_settings_exit_2_before_the_script_starts(
    tmp_path: Path, env: dict[str, str], flags: list[str], message: str
) -> None:
    marker = tmp_path / "started"
    path = script(tmp_path, f"open({str(marker)!r}, 'w').close()\n")
    result = CliRunner().invoke(app, ["run", *flags, str(path)], env={"GPUS": "none", **env})
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert not marker.exists()


def test_a_missing_script_or_module_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", str(tmp_path / "nope.py")], env={"GPUS": "none"})
    assert result.exit_code == 2 and "nope.py does not exist" in result.stderr
    result = CliRunner().invoke(app, ["run", "-m", "no_such_pkg_xyz.train"],
                                env={"GPUS": "none"})
    assert result.exit_code == 2 and "there is no module no_such_pkg_xyz.train" in result.stderr
    result = CliRunner().invoke(app, ["run"], env={"GPUS": "none"})
    assert result.exit_code == 2 and "mgpu run needs a script" in result.stderr


def test_settings_flags_go_before_the_script_and_the_rest_is_the_scripts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_api: None
) -> None:
    seen: dict[str, object] = {}

    def fake_prepare(runtime: object) -> None:
        seen["runtime"] = runtime

    def fake_run(target: launcher.Target, *_: object) -> int:
        seen["target"] = target
        return 7

    monkeypatch.setattr(launcher, "prepare", fake_prepare)
    monkeypatch.setattr(launcher, "run_target", fake_run)
    path = script(tmp_path, "")
    result = CliRunner().invoke(app, [
        "run", "--virtual-devices", "2", str(path),
        "--epochs", "9", "-m", "x", "--", "--gpus", "0",
    ], env={"GPUS": "none", "EPOCHS": "3"})
    assert result.exit_code == 7, result.output
    target = seen["target"]
    assert isinstance(target, launcher.Target)
    assert target.argv == [str(path), "--epochs", "9", "-m", "x", "--", "--gpus", "0"]
    runtime = seen["runtime"]
    assert runtime.settings.epochs == 3 and runtime.replicas == 2  # type: ignore[attr-defined]
    assert "mgpu run" in result.stderr and "2 x logical CPU" in result.stderr
    # EPOCHS is the packaged loop's: the summary says the script decides it.
    assert "EPOCHS=3: mgpu train's settings, which your script decides" in result.stderr


# ------------------------------------------------------------------------ running a script


def test_the_script_runs_as_main_with_its_argv_and_folder_first_on_the_path(
    tmp_path: Path, restore_sys: None, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "helper_mod_xyz.py").write_text("VALUE = 41\n")
    path = script(folder, "import sys, helper_mod_xyz\n"
                          "print(__name__, sys.argv, helper_mod_xyz.VALUE + 1)\n")
    try:
        code = launcher.run_target(launcher.resolve_target([str(path), "a", "--b"],
                                                           module=False))
    finally:
        sys.modules.pop("helper_mod_xyz", None)
    assert code == 0
    assert capsys.readouterr().out.strip() == f"__main__ {[str(path), 'a', '--b']} 42"
    assert sys.path[0] == str(folder.resolve())


@pytest.mark.parametrize(
    ("body", "code", "stderr"),
    [
        ("pass", 0, ""),
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit()", 0, ""),
        ("raise SystemExit('bad input file')", 1, "bad input file"),
        ("raise KeyboardInterrupt", 130, "KeyboardInterrupt"),
    ],
)
def test_exit_codes_pass_through(
    tmp_path: Path, restore_sys: None, capsys: pytest.CaptureFixture[str],
    body: str, code: int, stderr: str,
) -> None:
    path = script(tmp_path, body + "\n")
    assert launcher.run_target(launcher.resolve_target([str(path)], module=False)) == code
    assert stderr in capsys.readouterr().err


def test_an_exception_shows_the_scripts_traceback_only_and_exits_1(
    tmp_path: Path, restore_sys: None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = script(tmp_path, "def inner():\n    raise ValueError('shape (3,) wrong')\n"
                            "\ninner()\n")
    assert launcher.run_target(launcher.resolve_target([str(path)], module=False)) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert f'File "{path}", line 4, in <module>' in err and "in inner" in err
    assert err.strip().endswith("ValueError: shape (3,) wrong")
    assert "mgpu_env/launcher" not in err and "runpy" not in err


def test_dash_m_runs_a_module_from_the_working_folder(
    tmp_path: Path, restore_sys: None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    package = tmp_path / "user_pkg_xyz"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tool.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n"
                                     "sys.exit(int(sys.argv[1]))\n")
    monkeypatch.chdir(tmp_path)
    target = launcher.resolve_target(["user_pkg_xyz.tool", "4"], module=True)
    assert target.path == package / "tool.py"
    assert launcher.run_target(target) == 4
    assert capsys.readouterr().out.strip() == "__main__ ['4']"
    with pytest.raises(ConfigError, match="package without a __main__"):
        launcher.resolve_target(["user_pkg_xyz"], module=True)


# ---------------------------------------------------------------------------------- API


def test_the_api_reflects_the_adopted_runtime(fresh_api: None, tmp_path: Path) -> None:
    settings = resolve_settings({"GPUS": "none", "VIRTUAL_DEVICES": "4",
                                 "OUTPUT_DIR": str(tmp_path / "out")}, {}).settings
    api.adopt(runtime_of(settings), tensorflow_prepared=True)
    assert api.num_replicas() == 4
    assert api.global_batch_size(16) == 64
    assert api.is_chief() is True
    assert api.run_dir() == tmp_path / "out"
    with pytest.raises(ValueError, match="positive"):
        api.global_batch_size(0)


def test_a_non_chief_worker_is_not_the_chief_and_counts_every_workers_replicas(
    fresh_api: None,
) -> None:
    settings = resolve_settings({"GPUS": "none", "VIRTUAL_DEVICES": "2",
                                 "WORKER_HOSTS": "h0:2222,h1:2222", "WORKER_INDEX": "1",
                                 "RUN_NAME": "exp"}, {}).settings
    api.adopt(runtime_of(settings), tensorflow_prepared=True)
    # Two workers, one replica each: between workers on the CPU there is no logical split.
    assert api.is_chief() is False and api.num_replicas() == 2
    assert api.run_dir() == Path("runs/exp")


def test_plain_python_resolves_the_settings_itself_without_tensorflow(tmp_path: Path) -> None:
    # A fresh interpreter: importing mgpu_env and asking the runtime imports no TensorFlow,
    # reads the environment and .env, and writes CUDA_VISIBLE_DEVICES.
    (tmp_path / ".env").write_text("VIRTUAL_DEVICES=3\nRUN_NAME=from-file\n")
    probe = (
        "import os, sys, mgpu_env\n"
        "from mgpu_env import api\n"
        "print(api.runtime().replicas, mgpu_env.global_batch_size(2), mgpu_env.is_chief(),\n"
        "      mgpu_env.run_dir(), os.environ.get('CUDA_VISIBLE_DEVICES'),\n"
        "      'tensorflow' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "GPUS": "none"}, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "6", "True", "runs/from-file", "-1", "False"]


def test_plain_python_bad_settings_raise_the_same_message(
    fresh_api: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VIRTUAL_DEVICES", "lots")
    with pytest.raises(ConfigError, match="VIRTUAL_DEVICES='lots'"):
        api.runtime()


# ------------------------------------------------------------- the strategy that ran


def test_the_plan_is_said_in_the_words_of_the_setting_that_chose_it() -> None:
    from mgpu_env.launcher.strategy_watch import planned_replicas
    from mgpu_env.runtime.strategy import StrategyPlan

    def plan(devices: int, device_type: str, physical: int, kind: str = "mirrored") -> Any:
        names = tuple(f"/device:{device_type}:{i}" for i in range(devices))
        return StrategyPlan(kind, names, device_type, physical, "ring", "test")  # type: ignore[arg-type]

    assert planned_replicas(plan(2, "GPU", 2), 2, 1).by == "GPUS selected 2"
    assert planned_replicas(plan(2, "CPU", 1), 2, 1).by == "VIRTUAL_DEVICES planned 2"
    assert planned_replicas(plan(4, "GPU", 2), 4, 1).by == "VIRTUAL_DEVICES planned 4"
    assert planned_replicas(plan(1, "CPU", 1), 1, 1).by == "the plan has 1"
    between = planned_replicas(plan(2, "GPU", 2, "multi_worker"), 4, 2)
    assert between.by == "2 workers x 2 device(s) planned 4" and between.multi_worker


def test_each_way_a_script_strategy_can_differ_from_the_plan_has_its_words_and_fix() -> None:
    from mgpu_env.launcher.strategy_watch import BuiltStrategy, PlannedReplicas, mismatch

    gpus = PlannedReplicas(2, "GPUS selected 2", multi_worker=False)
    cluster = PlannedReplicas(4, "2 workers x 2 device(s) planned 4", multi_worker=True)
    mwms = BuiltStrategy("MultiWorkerMirroredStrategy", ("GPU:0",), 1)
    named = BuiltStrategy("MirroredStrategy", ("GPU:0",), 1)
    split_itself = BuiltStrategy("MirroredStrategy", ("CPU:0",), 1, planned_devices=True)
    one = BuiltStrategy("OneDeviceStrategy", ("GPU:0",), 1)
    more = BuiltStrategy("MirroredStrategy", ("GPU:0", "GPU:1", "GPU:2"), 3)
    agrees = BuiltStrategy("MirroredStrategy", ("GPU:0", "GPU:1"), 2)
    assert mismatch(agrees, gpus) is None
    said = mismatch(mwms, gpus)
    assert said is not None and said.startswith(
        "the script's MultiWorkerMirroredStrategy uses 1 device (1 replica in sync); "
        "GPUS selected 2. Fix: ") and "tf.distribute.MirroredStrategy()" in said
    assert "drop its devices argument" in (mismatch(named, gpus) or "")
    assert "the script set up 1 device itself" in (mismatch(split_itself, gpus) or "")
    assert "Fix:" not in (mismatch(split_itself, gpus) or "Fix:")
    assert "use tf.distribute.MirroredStrategy()" in (mismatch(one, gpus) or "")
    assert "MultiWorkerMirroredStrategy()" in (mismatch(agrees, cluster) or "")
    assert mismatch(more, gpus) == ("the script's MirroredStrategy uses 3 devices "
                                    "(3 replicas in sync); GPUS selected 2")


def test_real_strategies_are_recorded_as_they_are_built(
    logical_cpus: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import tensorflow as tf
    from tensorflow.python.distribute import distribute_lib

    from mgpu_env.launcher import strategy_watch

    # Restore TensorFlow's constructor, and forget what was built, after the test.
    monkeypatch.setattr(distribute_lib.StrategyBase, "__init__",
                        distribute_lib.StrategyBase.__init__)
    monkeypatch.setattr(strategy_watch, "_BUILT", [])
    planned = strategy_watch.PlannedReplicas(2, "VIRTUAL_DEVICES planned 2", False)
    strategy_watch.watch(planned)
    strategy_watch.watch(planned)  # twice: still one wrapper
    tf.distribute.MirroredStrategy(list(logical_cpus[:2]))
    tf.distribute.MirroredStrategy([logical_cpus[0]])
    tf.distribute.OneDeviceStrategy(logical_cpus[1])
    tf.distribute.MirroredStrategy([logical_cpus[0]])  # the same again: said once
    tf.distribute.get_strategy()  # TensorFlow's default: not the script's
    built = strategy_watch.built_strategies()
    assert [(b.kind, b.devices, b.replicas) for b in built] == [
        ("MirroredStrategy", ("CPU:0", "CPU:1"), 2),
        ("MirroredStrategy", ("CPU:0",), 1),
        ("OneDeviceStrategy", ("CPU:1",), 1),
        ("MirroredStrategy", ("CPU:0",), 1),
    ]
    # Built is not run: each is said once, with the plan where its replicas differ, and no
    # fix (the plan is held against a strategy at its first step: test_run_observer.py).
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "mgpu run: strategy built: MirroredStrategy on 2 devices (CPU:0, CPU:1), 2 replicas "
        "in sync",
        "mgpu run: strategy built: MirroredStrategy on 1 device (CPU:0), 1 replica in sync "
        "(VIRTUAL_DEVICES planned 2)",
        "mgpu run: strategy built: OneDeviceStrategy on 1 device (CPU:1), 1 replica in sync "
        "(VIRTUAL_DEVICES planned 2)",
    ]
