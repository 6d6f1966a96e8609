"""Every JSON document mgpu writes carries `schema_version`, an int: a parser checks it
before it reads anything else."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.bench.sweep import run_bench
from mgpu_env.training.run import rundir
from tests.support.bench import fake_runner, settings
from tests.support.cli_process import mgpu
from tests.support.fake_nvml import FakeNvml, fake_with
from tests.support.runtimes import runtime_of

IDENTITY = {"dataset": "digits", "global_batch_size": 64}


def assert_versioned(data: dict[str, Any]) -> None:
    assert isinstance(data.get("schema_version"), int), sorted(data)
    assert not isinstance(data["schema_version"], bool)


def test_doctor_json(use_fake_nvml: Callable[[FakeNvml], FakeNvml]) -> None:
    use_fake_nvml(fake_with(0))
    for args in (["--no-tf"], ["--gpus", "first"]):  # a report, and unreadable settings
        out = CliRunner().invoke(app, ["doctor", "--json", *args]).stdout
        assert_versioned(json.loads(out))


def test_bench_json() -> None:
    data = run_bench(runtime_of(settings(VIRTUAL_DEVICES="2")), environ={},
                     runner=fake_runner()).as_dict()
    assert_versioned(data)
    assert "schema" not in data


def test_run_folder_files_written_before_training(tmp_path: Path) -> None:
    rundir.claim_run_folder(rundir.inspect_run_folder(tmp_path, IDENTITY), IDENTITY)
    rundir.write_history(tmp_path, [{"epoch": 1, "loss": 0.5}])
    for name in (rundir.RUN_FILE, rundir.HISTORY_FILE):
        assert_versioned(json.loads((tmp_path / name).read_text()))


def test_dry_run_json(tmp_path: Path) -> None:
    done = mgpu(tmp_path, "train", "--dry-run", "--json", GPUS="none", DATASET="digits")
    assert done.returncode == 0, done.stderr
    assert_versioned(json.loads(done.stdout))


@pytest.mark.slow
def test_a_finished_runs_files(tmp_path: Path) -> None:
    output = tmp_path / "run"
    done = mgpu(tmp_path, "train", GPUS="none", DATASET="digits", EPOCHS="1",
                OUTPUT_DIR=str(output))
    assert done.returncode == 0, done.stderr
    for name in (rundir.RUN_FILE, rundir.HISTORY_FILE, rundir.SETTINGS_FILE,
                 rundir.METRICS_FILE):
        assert_versioned(json.loads((output / name).read_text()))
