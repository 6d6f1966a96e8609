"""Settings: precedence (flag > environment > .env > default) and clear refusals (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.config.settings import DECLARATIONS, GpuRequest, SettingsErrors
from tests.support.children import REPO
from tests.support.runtimes import runtime_of


def test_defaults_when_nothing_is_set() -> None:
    resolved = resolve_settings({}, {})
    s = resolved.settings
    assert (s.epochs, s.batch_size, s.learning_rate, s.seed) == (5, 64, 0.001, 42)
    assert s.gpus == GpuRequest("all")
    assert s.mixed_precision == "0" and s.xla is False and s.dataset == "auto"
    assert s.output_dir is None and s.data_dir is None and s.env_file is None
    assert {d.env for d in DECLARATIONS if resolved.origin(d.env) == "default"} == {
        d.env for d in DECLARATIONS}


@pytest.mark.parametrize(
    ("flag", "environ", "file_line", "expected", "source"),
    [
        ("7", {"EPOCHS": "3"}, "EPOCHS=2", 7, "flag --epochs"),
        (None, {"EPOCHS": "3"}, "EPOCHS=2", 3, "the environment"),
        (None, {}, "EPOCHS=2", 2, "file"),
        (None, {}, "", 5, "default"),
    ],
)
def test_precedence_flag_env_file_default(
    tmp_path: Path,
    flag: str | None,
    environ: dict[str, str],
    file_line: str,
    expected: int,
    source: str,
) -> None:
    env_file = tmp_path / "settings.env"
    env_file.write_text(file_line + "\n")
    resolved = resolve_settings(
        {"EPOCHS": flag}, {**environ, "ENV_FILE": str(env_file)}
    )
    assert resolved.settings.epochs == expected
    assert resolved.sources["EPOCHS"].startswith(source)


def test_dotenv_in_working_folder_is_read_without_env_file() -> None:
    Path(".env").write_text("BATCH_SIZE=128\nMIXED_PRECISION=bf16\n")
    resolved = resolve_settings({}, {})
    assert resolved.settings.batch_size == 128
    assert resolved.settings.mixed_precision == "bf16"
    assert resolved.env_file == Path(".env")


def test_env_file_flag_beats_env_file_variable(tmp_path: Path) -> None:
    (tmp_path / "a.env").write_text("EPOCHS=11\n")
    (tmp_path / "b.env").write_text("EPOCHS=22\n")
    resolved = resolve_settings(
        {"ENV_FILE": str(tmp_path / "b.env")}, {"ENV_FILE": str(tmp_path / "a.env")}
    )
    assert resolved.settings.epochs == 22


def test_env_file_extras_are_exported_but_never_override(tmp_path: Path) -> None:
    env_file = tmp_path / "x.env"
    env_file.write_text("NCCL_DEBUG=INFO\nTF_CPP_MIN_LOG_LEVEL=2\nEPOCHS=3\n")
    resolved = resolve_settings({}, {"ENV_FILE": str(env_file)})
    environ = {"TF_CPP_MIN_LOG_LEVEL": "0"}
    runtime = runtime_of(resolved, environ=environ)
    exported = [k for k in runtime.environment if k in resolved.env_file_values]
    assert exported == ["NCCL_DEBUG"]
    runtime.apply(environ)
    assert {k: environ[k] for k in ("TF_CPP_MIN_LOG_LEVEL", "NCCL_DEBUG")} == {
        "TF_CPP_MIN_LOG_LEVEL": "0", "NCCL_DEBUG": "INFO"}


def test_all_bad_values_reported_together() -> None:
    with pytest.raises(SettingsErrors) as caught:
        resolve_settings({"EPOCHS": "0"}, {"BATCH_SIZE": "big", "XLA": "maybe"})
    text = str(caught.value)
    assert len(caught.value.errors) == 3
    for name in ("EPOCHS='0'", "BATCH_SIZE='big'", "XLA='maybe'"):
        assert name in text


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("EPOCHS", "0", "out of range 1..100000"),
        ("EPOCHS", "five", "not a whole number"),
        ("EPOCHS", "2.5", "not a whole number"),
        ("BATCH_SIZE", "-64", "out of range"),
        ("LEARNING_RATE", "0", "must be above 0"),
        ("LEARNING_RATE", "nan", "not a number"),
        ("LEARNING_RATE", "1e999", "must be above 0"),
        ("LEARNING_RATE", "fast", "not a number"),
        ("MIXED_PRECISION", "fp8", "not one of the choices"),
        ("XLA", "maybe", "not a yes/no value"),
        ("CROSS_DEVICE_OPS", "ring", "not one of the choices"),
        ("DATASET", "cifar10", "not one of the choices"),
        ("VIRTUAL_DEVICES", "65", "out of range 0..64"),
        ("SEED", "-1", "out of range"),
        ("GPUS", "0,0", "index 0 is listed twice"),
        ("GPUS", "0,,1", "empty item"),
        ("GPUS", "first", "neither a GPU index nor a GPU UUID"),
        ("GPUS", "-1", "not a GPU index"),
        ("GPUS", "0,GPU-12345678", "cannot be mixed"),
        ("GPUS", "MIG-12345678-aaaa", "MIG instances cannot be selected"),
        ("RUN_NAME", "../elsewhere", "not a plain folder name"),
        ("RUN_NAME", "a/b", "not a plain folder name"),
        ("DATA_DIR", "/no/such/folder", "does not exist"),
        ("ENV_FILE", "/no/such/file.env", "does not exist"),
    ],
)
def test_bad_value_exits_2_naming_the_setting(name: str, value: str, fragment: str) -> None:
    result = CliRunner().invoke(app, ["train", "--dry-run"], env={name: value})
    assert result.exit_code == 2, result.output
    assert f"{name}={value!r}" in result.stderr
    assert fragment in result.stderr
    assert "Valid:" in result.stderr and "Fix:" in result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 2


def test_output_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "metrics.json"
    target.write_text("{}")
    result = CliRunner().invoke(app, ["train", "--output-dir", str(target), "--dry-run"])
    assert result.exit_code == 2
    assert "is a file, not a folder" in result.stderr
    assert target.read_text() == "{}"


def test_bad_value_in_env_file_names_the_file(tmp_path: Path) -> None:
    env_file = tmp_path / "bad.env"
    env_file.write_text("BATCH_SIZE=0\n")
    result = CliRunner().invoke(app, ["train", "--dry-run"], env={"ENV_FILE": str(env_file)})
    assert result.exit_code == 2
    assert f"from file {env_file}" in result.stderr
    assert f"edit BATCH_SIZE in {env_file}" in result.stderr


def test_debug_shows_traceback_for_unexpected_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "def boom(*a, **k): raise RuntimeError('kaput')\n"
        "import entrypoint.train as t; t.start_process = boom\n"
        "from entrypoint.app import main; sys.argv = ['mgpu'] + sys.argv[1:]; main()\n"
    )
    plain = subprocess.run(
        [sys.executable, "-c", code, "train", "--gpus", "none"], capture_output=True, text=True
    )
    assert plain.returncode == 1
    assert "RuntimeError: kaput" in plain.stderr and "Traceback" not in plain.stderr
    debug = subprocess.run(
        [sys.executable, "-c", code, "--debug", "train", "--gpus", "none"],
        capture_output=True,
        text=True,
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr


@pytest.mark.parametrize("command", ["train", "bench"])
def test_help_lists_every_setting_with_its_env_var(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    shown = [d for d in DECLARATIONS if d.scope == ("common",) or command in d.scope]
    for declaration in shown:
        assert declaration.flag in result.output
        assert f"env {declaration.env}" in " ".join(result.output.split())
    hidden = [d for d in DECLARATIONS if d not in shown]
    for declaration in hidden:
        assert declaration.flag not in result.output


def test_top_level_help_lists_the_commands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    # Each command as typer lists it: its name alone at the start of a table row.
    listed = {line.strip(" │").split()[0] for line in result.output.splitlines()
              if line.strip(" │")}
    for command in ("train", "doctor", "bench"):
        assert command in listed


def test_env_file_extras_reach_the_run_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    import entrypoint.options as options

    env_file = tmp_path / "x.env"
    env_file.write_text("NCCL_DEBUG=INFO\n")
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    monkeypatch.setenv("ENV_FILE", str(env_file))
    runtime_of(options.resolve({}), environ=os.environ).apply()
    assert os.environ["NCCL_DEBUG"] == "INFO"
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"


@pytest.mark.parametrize(
    ("name", "text", "meant"),
    [("DATASET", "mnsit", "mnist"), ("MIXED_PRECISION", "bf61", "bf16"),
     ("BENCH_SWEEP", "precison", "precision"), ("CROSS_DEVICE_OPS", "ncll", "nccl")],
)
def test_a_near_miss_of_a_fixed_choice_says_did_you_mean(name: str, text: str, meant: str) -> None:
    from mgpu_env.config.resolve import resolve_settings
    from mgpu_env.config.settings import SettingsErrors

    with pytest.raises(SettingsErrors) as caught:
        resolve_settings({}, {name: text})
    assert f"did you mean {meant}?\n" in caught.value.user_message()


# ------------------------------------------------------------------------------- roles


def settings_read_by(*folders: str) -> set[str]:
    """The Settings fields the code in `folders` reads (`settings.epochs`, `...settings.seed`)."""
    import ast

    fields = {d.field_name for d in DECLARATIONS}
    repo = REPO
    read: set[str] = set()
    for folder in folders:
        for path in sorted((repo / folder).rglob("*.py")) or [repo / f"{folder}.py"]:
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Attribute) and node.attr in fields
                        and isinstance(node.value, (ast.Name, ast.Attribute))
                        and (getattr(node.value, "id", "") == "settings"
                             or getattr(node.value, "attr", "") == "settings")):
                    read.add(node.attr)
    return read


def test_every_setting_a_training_run_reads_is_recorded_in_the_run() -> None:
    read = settings_read_by("mgpu_env/training", "mgpu_env/runtime", "entrypoint/train")
    by_field = {d.field_name: d for d in DECLARATIONS}
    assert {"epochs", "keras", "seed", "data_deterministic"} <= read  # the scan sees them
    missing = sorted(by_field[name].env for name in read if "recorded" not in by_field[name].roles)
    assert not missing, f"read by a training run but not recorded in it: {missing}"


def test_the_roles_nest_as_a_run_uses_them() -> None:
    from mgpu_env.config.settings import with_role

    recorded = set(with_role("recorded"))
    # Shown, resumed and agreed values are all in settings.json; an identity is resumed.
    assert set(with_role("shown")) <= recorded and set(with_role("agreed")) <= recorded
    assert set(with_role("resumed")) <= recorded
    assert set(with_role("identity")) <= set(with_role("resumed"))
    # What a script decides is a setting of mgpu train's loop (its flags show on train).
    assert all("train" in d.scope for d in DECLARATIONS if "script" in d.roles)
    # A setting no training run reads (bench's own) has no role in one.
    assert all(not d.roles for d in DECLARATIONS if d.scope == ("bench",))


def test_keras_is_recorded_resumed_and_agreed_and_a_script_decides_its_data_order() -> None:
    from mgpu_env.launcher import SCRIPT_DECIDES
    from mgpu_env.training.multiworker import agreement_values
    from mgpu_env.training.run.plan import RUN_SETTINGS
    from mgpu_env.training.run.resume import RESUMED_SETTINGS

    assert "KERAS" in RUN_SETTINGS and "KERAS" in RESUMED_SETTINGS
    values = agreement_values(resolve_settings({}, {"KERAS": "2"}).settings, {"KERAS": "2"},
                              local_replicas=1, train_samples=10, steps_per_epoch=1)
    assert values["KERAS"] == "2"
    assert "DATA_DETERMINISTIC" in SCRIPT_DECIDES and "WORKER_TIMEOUT" in SCRIPT_DECIDES
