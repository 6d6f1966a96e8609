"""Logs and CI get plain text: colours only on a terminal, NO_COLOR everywhere."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from entrypoint.train import interactive, settings_lines
from mgpu_env.training.run.progress import EpochLines
from tests.support.children import REPO

COLOUR = re.compile(r"\x1b\[[0-9;]*(3[0-7]|9[0-7]|38;)[0-9;]*m")


def make_help(env: dict[str, str], tty: bool) -> str:
    if tty:
        leader, follower = os.openpty()
        with os.fdopen(leader, "rb") as read_end:
            subprocess.run(["make", "-s", "-C", str(REPO), "help"], env=env, stdout=follower,
                           check=True, timeout=30)
            os.close(follower)
            chunks = []
            while True:
                try:
                    chunk = read_end.read1(65536)
                except OSError:  # the terminal's other end is closed: all read
                    break
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode()
    return subprocess.run(["make", "-s", "-C", str(REPO), "help"], env=env, capture_output=True,
                          text=True, check=True, timeout=30).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="requires make")
def test_make_help_colours_only_on_a_terminal() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    piped = make_help(env, tty=False)
    assert "test-fast" in piped and "\x1b" not in piped
    assert COLOUR.search(make_help(env, tty=True))
    assert "\x1b" not in make_help({**env, "NO_COLOR": "1"}, tty=True)


def test_help_is_plain_text_even_where_colour_is_forced() -> None:
    # Click's plain help (rich's panels cut option names at 80 columns): no colour codes.
    for no_color in ("", "1"):
        shown = CliRunner().invoke(app, ["--help"], env={"FORCE_COLOR": "1", "NO_COLOR": no_color})
        assert not COLOUR.search(shown.stdout)


def test_progress_bar_only_on_a_colour_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert interactive(Terminal(), {}) is True
    assert interactive(Terminal(), {"NO_COLOR": "1"}) is False
    assert interactive(io.StringIO(), {}) is False


def test_one_plain_line_per_epoch() -> None:
    lines: list[str] = []
    progress = EpochLines(lines.append)
    for epoch in (1, 2):
        progress.epoch_begin(epoch, 2, 22)
        progress.steps_done(22, 0.5, 0.9)
        progress.epoch_end({"epoch": epoch, "loss": 0.41213, "accuracy": 0.887,
                            "samples_per_sec": 2124.4, "seconds": 0.66})
    assert lines == [
        "Epoch 1/2: loss 0.4121, accuracy 0.8870, 2,124 samples/s, 0.7 s",
        "Epoch 2/2: loss 0.4121, accuracy 0.8870, 2,124 samples/s, 0.7 s",
    ]


def test_start_summary_says_where_each_setting_came_from() -> None:
    lines = settings_lines({
        "GPUS": {"value": "all", "source": "default"},
        "EPOCHS": {"value": "1", "source": "env"},
        "BATCH_SIZE": {"value": "128", "source": ".env"},
    })
    provenance = {
        "GPUS": {"value": "all", "source": "default"},
        "EPOCHS": {"value": "1", "source": "env"},
        "BATCH_SIZE": {"value": "128", "source": ".env"},
    }
    assert lines == ["  settings       EPOCHS=1 (env), BATCH_SIZE=128 (.env), "
                     "1 default (--verbose lists them)"]
    verbose = " ".join(settings_lines(provenance, verbose=True))
    assert verbose.startswith("  settings       EPOCHS=1 (env), BATCH_SIZE=128 (.env)")
    assert "GPUS=all (default)" in verbose and "--verbose" not in verbose
    assert all(len(line) <= 100 for line in lines)


def test_dry_run_summary_shows_sources_from_a_settings_file(tmp_path: Path) -> None:
    Path(".env").write_text("BATCH_SIZE=128\n")
    result = CliRunner().invoke(app, ["train", "--dry-run"],
                                env={"EPOCHS": "1", "GPUS": "none", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    for shown in ("EPOCHS=1 (env)", "BATCH_SIZE=128 (.env)", "GPUS=none (env)",
                  "defaults (--verbose lists them)"):
        assert shown in out
    assert "SEED=42 (default)" not in out
    verbose = CliRunner().invoke(app, ["train", "--dry-run", "--verbose"],
                                 env={"EPOCHS": "1", "GPUS": "none", "COLUMNS": "200"})
    assert "SEED=42 (default)" in " ".join(verbose.stdout.split())


def test_an_unused_cross_device_ops_is_said() -> None:
    result = CliRunner().invoke(app, ["train", "--dry-run"],
                                env={"GPUS": "none", "CROSS_DEVICE_OPS": "nccl"})
    assert result.exit_code == 0, result.output
    assert "note: CROSS_DEVICE_OPS=nccl is not used: with one replica" in result.stdout
