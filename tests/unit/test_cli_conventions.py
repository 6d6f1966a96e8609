"""The conventions a new user expects: --version, completion, on/off flags, typo warnings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.config.resolve import likely_setting, resolve_settings
from mgpu_env.config.settings import DECLARATIONS
from mgpu_env.tfprobes import tfimport

WIDE = {"COLUMNS": "250"}


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_names_mgpu_tensorflow_and_the_image(flag: str) -> None:
    result = CliRunner().invoke(app, [flag], env={"MGPU_IMAGE_TAG": "mgpu-env:0.1.0"})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("mgpu 0.1.0, TensorFlow 2.21.0, Python ")
    assert "image mgpu-env:0.1.0" in result.stdout
    plain = CliRunner().invoke(app, [flag], env={"MGPU_IMAGE_TAG": ""})
    assert "image" not in plain.stdout


def test_version_never_imports_tensorflow() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from entrypoint.app import main\n"
        "sys.argv = ['mgpu', '--version']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "assert 'tensorflow' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "TensorFlow 2.21.0" in done.stdout


def test_shell_completion_is_offered() -> None:
    result = CliRunner().invoke(app, ["--help"], env=WIDE)
    assert "--install-completion" in result.stdout


@pytest.mark.parametrize("command", ["train", "bench", "doctor"])
def test_help_shows_no_bool_metavar(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], env=WIDE)
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout
    assert "0|1" not in result.stdout


def test_switches_are_flag_pairs() -> None:
    result = CliRunner().invoke(app, ["train", "--help"], env=WIDE)
    switches = [d for d in DECLARATIONS
                if d.kind == "switch" and (d.scope == ("common",) or "train" in d.scope)]
    assert {d.env for d in switches} >= {"XLA", "QUIET"}
    for declaration in switches:
        assert declaration.off_flag in result.stdout
    assert "-q" in result.stdout


@pytest.mark.parametrize(
    ("args", "quiet", "xla"),
    [
        (["--quiet"], "1", None),  # the flag takes no value ...
        (["-q"], "1", None),
        (["--no-quiet", "--xla"], "0", "1"),
        (["--no-xla"], None, "0"),
    ],
)
def test_switch_flags_reach_the_settings(
    monkeypatch: pytest.MonkeyPatch, args: list[str], quiet: str | None, xla: str | None
) -> None:
    import entrypoint.train as train

    seen: dict[str, str | None] = {}

    def stop(flags: dict[str, str | None], resolver: object = None) -> None:
        seen.update(flags)
        raise RuntimeError("stop here")

    monkeypatch.setattr(train, "resolve", stop)
    # ... so --dry-run after it is a flag of its own, not QUIET's value.
    result = CliRunner().invoke(app, ["train", *args, "--dry-run"])
    assert "stop here" in result.stderr, result.output
    assert (seen["QUIET"], seen["XLA"]) == (quiet, xla)


def test_quiet_then_dry_run_is_a_dry_run() -> None:
    result = CliRunner().invoke(app, ["train", "--quiet", "--dry-run", "--gpus", "none"])
    assert result.exit_code == 0, result.output
    assert "dry run" in result.stdout


@pytest.mark.parametrize("text", ["0", "1", "true", "false", "yes", "no", "on", "off"])
def test_switches_still_read_words_from_the_environment(text: str) -> None:
    resolved = resolve_settings({}, {"XLA": text, "QUIET": text})
    expected = text in ("1", "true", "yes", "on")
    assert resolved.settings.xla is expected and resolved.settings.quiet is expected


def test_bench_has_its_own_help_for_the_output_folder() -> None:
    bench = CliRunner().invoke(app, ["bench", "--help"], env=WIDE).stdout
    train = CliRunner().invoke(app, ["train", "--help"], env=WIDE).stdout
    train, bench = " ".join(train.split()), " ".join(bench.split())  # as wrapped
    assert "again resumes" in train
    assert "again resumes" not in bench
    assert "bench.json" in bench


def test_doctor_takes_env_file(tmp_path: Path, use_fake_nvml: object) -> None:
    from tests.support.fake_nvml import fake_with

    use_fake_nvml(fake_with(1))  # type: ignore[operator]
    env_file = tmp_path / "doctor.env"
    env_file.write_text("GPUS=none\n")
    result = CliRunner().invoke(app, ["doctor", "--no-tf", "--env-file", str(env_file)],
                                env=WIDE)
    assert "GPUS=none: training uses the CPU" in result.stdout, result.output


# ------------------------------------------------------------------------------ typos


@pytest.mark.parametrize(
    ("name", "meant"),
    [("EPOCH", "EPOCHS"), ("GPU", "GPUS"), ("MIXED_PRECISON", "MIXED_PRECISION"),
     ("BATCHSIZE", "BATCH_SIZE"), ("WORKER_HOST", "WORKER_HOSTS")],
)
def test_a_mistyped_setting_is_named(name: str, meant: str) -> None:
    assert likely_setting(name) == meant


@pytest.mark.parametrize(
    "name",
    ["NCCL_DEBUG", "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES", "COMPOSE_FILE", "HOST_UID",
     "NVIDIA_VISIBLE_DEVICES", "XLA_FLAGS", "PYTHONPATH", "LD_LIBRARY_PATH", "RUNNER_NAME",
     "VIRTUAL_ENV", "MGPU_DEBUG", "SHM_SIZE", "HOME", "EPOCHS"],
)
def test_well_known_variables_pass_quietly(name: str) -> None:
    assert likely_setting(name) is None


def test_typo_in_env_file_and_environment_warns_on_stderr(tmp_path: Path) -> None:
    env_file = tmp_path / "x.env"
    env_file.write_text("EPOCH=3\nNCCL_DEBUG=INFO\n")
    result = CliRunner().invoke(
        app, ["train", "--dry-run"],
        env={"ENV_FILE": str(env_file), "GPUS": "none", "GPU": "0,1",
             "MIXED_PRECISON": "1", "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.exit_code == 0, result.output
    err = result.stderr
    assert f"EPOCH in {env_file} is not a setting; did you mean EPOCHS?" in err
    assert "GPU in the environment is not a setting; did you mean GPUS?" in err
    assert "did you mean MIXED_PRECISION?" in err
    assert "NCCL" not in err and "TF_CPP" not in err
    assert "warning:" not in result.stdout


def test_the_library_returns_warnings_as_data() -> None:
    resolved = resolve_settings({}, {"EPOCH": "3"})
    assert resolved.warnings == (
        "EPOCH in the environment is not a setting; did you mean EPOCHS? "
        "(EPOCH='3' is ignored; EPOCHS is 5 (default))",
    )


# -------------------------------------------------------------- quiet TensorFlow import


def _write_to_fd2(text: str) -> str:
    os.write(2, text.encode())
    return "done"


def test_fd2_output_is_held_back(capfd: pytest.CaptureFixture[str]) -> None:
    assert tfimport.run_quietly(lambda: _write_to_fd2("C++ noise\n")) == "done"
    assert capfd.readouterr().err == ""


def test_fd2_output_is_shown_when_asked(capfd: pytest.CaptureFixture[str]) -> None:
    tfimport.run_quietly(lambda: _write_to_fd2("C++ noise\n"), show=True)
    assert capfd.readouterr().err == "C++ noise\n"


def test_fd2_output_is_shown_when_the_action_fails(capfd: pytest.CaptureFixture[str]) -> None:
    def fail() -> None:
        _write_to_fd2("why it failed\n")
        raise ImportError("no tensorflow")

    with pytest.raises(ImportError):
        tfimport.run_quietly(fail)
    assert capfd.readouterr().err == "why it failed\n"


def test_tensorflow_is_imported_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    fake = types.ModuleType("tensorflow")
    imports: list[str] = []

    def import_once() -> types.ModuleType:
        imports.append("tensorflow")
        sys.modules["tensorflow"] = fake
        return fake

    real = sys.modules.pop("tensorflow", None)
    monkeypatch.setattr(tfimport, "_import", import_once)
    try:
        assert tfimport.import_tensorflow() is fake
        assert tfimport.import_tensorflow() is fake
    finally:
        del sys.modules["tensorflow"]
        if real is not None:
            sys.modules["tensorflow"] = real
    assert imports == ["tensorflow"]


def test_no_gpu_switches_off_tensorflows_gpu_devices() -> None:
    from mgpu_env.hardware.devices import TF_DEVICE_TYPES, cuda_environment

    assert cuda_environment("-1", uses_gpu=False)[TF_DEVICE_TYPES] == "CPU"
    assert TF_DEVICE_TYPES not in cuda_environment("0,1", uses_gpu=True)


def test_debug_flag_shows_the_startup_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tfimport.STARTUP_LOG, "show", False)
    CliRunner().invoke(app, ["--debug", "train", "--help"])
    assert tfimport.STARTUP_LOG.show is True
