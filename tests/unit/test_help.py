"""`--help` reads at 80 columns, and each command offers only the settings it uses."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from entrypoint.app import app

COMMANDS = [[], ["train"], ["run"], ["bench"], ["doctor"]]


def help_text(command: list[str]) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


def offered(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", text))


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(["mgpu", *c]))
def test_help_fits_80_columns_with_every_option_name_whole(command: list[str]) -> None:
    text = help_text(command)
    for line in text.splitlines():
        assert len(line) <= 80, line
        assert line == line.rstrip(), f"trailing spaces: {line!r}"
    assert "…" not in text and "<list[str]>" not in text
    if command:
        # Every option name the command has is in its help, whole.
        names = [
            name
            for param in typer.main.get_command(app).commands[command[0]].params  # type: ignore[attr-defined]
            for name in [*param.opts, *param.secondary_opts]
            if name.startswith("--")
        ]
        assert names
        missing = [name for name in names if name not in offered(text)]
        assert not missing, missing

@pytest.mark.parametrize(
    ("command", "absent"),
    [("run", ["--epochs", "--dataset", "--model", "--learning-rate", "--batch-size", "--seed"]),
     ("bench", ["--epochs", "--learning-rate"])],
)
def test_a_command_offers_no_setting_it_ignores(command: str, absent: list[str]) -> None:
    text = help_text([command])
    assert not offered(text) & set(absent), offered(text) & set(absent)
    assert "--gpus" in offered(text) and "--virtual-devices" in offered(text)


def test_train_offers_every_setting_of_its_loop() -> None:
    text = help_text(["train"])
    for flag in ["--epochs", "--learning-rate", "--dataset", "--model", "--worker-timeout"]:
        assert flag in offered(text)


@pytest.mark.parametrize("args", [["bench", "--epochs", "3"], ["run", "--epochs", "3", "x.py"]])
def test_an_ignored_flag_is_a_usage_error(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--epochs" in result.output
