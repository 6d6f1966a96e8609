"""`--strict` / `MGPU_STRICT=1`: an unknown or misspelled setting is an error (exit 2) on
`mgpu train`, `mgpu run` and `mgpu bench`, not a warning that scrolls away."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.config.resolve import resolve_settings, strict_errors

COMMANDS = [["train", "--dry-run"], ["run", "script.py"], ["bench"]]


@pytest.fixture(autouse=True)
def _in_empty_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no .env of the repository's
    for name in ("EPOCH", "EPOCHS", "MGPU_STRICT", "ENV_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_misspelled_setting_in_the_environment_is_exit_2(command: list[str], how: str) -> None:
    args = [command[0], *(["--strict"] if how == "flag" else []), *command[1:]]
    env = {"EPOCH": "200", **({"MGPU_STRICT": "1"} if how == "env" else {})}
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    assert "Unknown setting EPOCH='200' (in the environment): did you mean EPOCHS?" in (
        result.output)
    assert "export EPOCHS=200" in result.output
    assert "Traceback" not in result.output


def test_an_unknown_name_in_the_settings_file_is_exit_2_and_other_tools_pass(
    tmp_path: Path,
) -> None:
    (tmp_path / ".env").write_text("EPOCH=3\nLEARNIN_RATE=0.1\nMY_FLAG=1\nNCCL_DEBUG=INFO\n"
                                   "COMPOSE_FILE=docker-compose.yml\nSHM_SIZE=8gb\n")
    result = CliRunner().invoke(app, ["bench", "--strict"])
    assert result.exit_code == 2, result.output
    for line in ("Unknown setting EPOCH='3' (in .env): did you mean EPOCHS?",
                 "Unknown setting LEARNIN_RATE='0.1' (in .env): did you mean LEARNING_RATE?",
                 "Unknown setting MY_FLAG='1' (in .env): mgpu has no such setting"):
        assert line in result.output, result.output
    for name in ("NCCL_DEBUG", "COMPOSE_FILE", "SHM_SIZE"):
        assert name not in result.output


def test_without_strict_a_misspelling_is_a_warning_and_an_unknown_file_name_passes(
    tmp_path: Path,
) -> None:
    (tmp_path / ".env").write_text("EPOCH=3\nMY_FLAG=1\n")
    resolved = resolve_settings({}, {})
    assert resolved.settings.epochs == 5
    assert len(resolved.warnings) == 1 and "did you mean EPOCHS?" in resolved.warnings[0]
    assert [u.name for u in resolved.unknown] == ["EPOCH", "MY_FLAG"]
    assert len(strict_errors(resolved)) == 2


def test_strict_passes_clean_settings() -> None:
    resolved = resolve_settings({"EPOCHS": "2"}, {"EPOCHS": "3", "NCCL_DEBUG": "INFO",
                                                  "HOME": "/root", "WORKER_INDEX": "0"})
    assert strict_errors(resolved) == []


def test_strict_on_a_command_that_resolves_clean_settings_goes_on(tmp_path: Path) -> None:
    # A GPU the machine lacks is the next stop after the settings: strict let them through.
    (tmp_path / "script.py").write_text("")
    result = CliRunner().invoke(app, ["run", "--strict", "--gpus", "7", "script.py"],
                                env={"GPUS": None, "MGPU_STRICT": "1"})
    assert result.exit_code == 2, result.output
    assert "Unknown setting" not in result.output
    assert "there is no GPU 7" in result.output


def test_doctor_keeps_its_own_strict() -> None:
    result = CliRunner().invoke(app, ["doctor", "--help"], env={"COLUMNS": "80"})
    assert "Warnings count as errors" in result.output
