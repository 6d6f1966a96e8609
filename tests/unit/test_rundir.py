"""The run folder's rules (no TensorFlow): identity, refusals, atomic writes, history."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.resolve import resolve_settings
from mgpu_env.training.run import rundir
from mgpu_env.training.run.identity import run_identity

IDENTITY = run_identity(resolve_settings({}, {}).settings, "digits", "float32", 64)


def test_a_new_or_empty_folder_is_fresh(tmp_path: Path) -> None:
    assert rundir.inspect_run_folder(tmp_path / "new", IDENTITY).fresh
    assert rundir.inspect_run_folder(tmp_path, IDENTITY).fresh


def test_a_folder_with_another_runs_settings_is_refused(tmp_path: Path) -> None:
    folder = rundir.inspect_run_folder(tmp_path, IDENTITY)
    rundir.claim_run_folder(folder, IDENTITY)
    other = {**IDENTITY, "learning_rate": 0.01, "dataset": "mnist"}
    with pytest.raises(ConfigError) as caught:
        rundir.inspect_run_folder(tmp_path, other)
    message = str(caught.value)
    assert "LEARNING_RATE: 0.001 there, 0.01 now" in message
    assert "DATASET: 'digits' there, 'mnist' now" in message
    assert "another RUN_NAME or OUTPUT_DIR" in message
    # What a resume may change comes from the settings' declared roles.
    assert "may change GPUS" in message and "CHECKPOINT_EVERY" in message
    assert "not MIXED_PRECISION, BATCH_SIZE, LEARNING_RATE, DATASET, MODEL, SEED" in message
    again = rundir.inspect_run_folder(tmp_path, IDENTITY)
    assert not again.fresh and again.finished_metrics is None


def test_a_folder_with_outputs_but_no_run_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"no run\.json"):
        rundir.inspect_run_folder(tmp_path, IDENTITY)


def test_finished_metrics_are_recognised(tmp_path: Path) -> None:
    rundir.claim_run_folder(rundir.inspect_run_folder(tmp_path, IDENTITY), IDENTITY)
    rundir.atomic_write_json(tmp_path / "metrics.json", {"status": "finished",
                                                          "epochs_completed": 5})
    folder = rundir.inspect_run_folder(tmp_path, IDENTITY)
    assert folder.finished_metrics == {"status": "finished", "epochs_completed": 5}


def test_atomic_write_replaces_whole_files_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "metrics.json"
    rundir.atomic_write_json(target, {"a": 1})
    rundir.atomic_write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert os.listdir(tmp_path) == ["metrics.json"]
    assert target.stat().st_mode & 0o044  # readable by others, like a file open() makes


def test_a_failed_save_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "model.keras"
    target.write_text("old model")

    def broken(path: Path) -> None:
        path.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        rundir.atomic_save(target, broken, ".keras")
    assert target.read_text() == "old model" and os.listdir(tmp_path) == ["model.keras"]


def test_history_is_cut_back_to_the_checkpoint(tmp_path: Path) -> None:
    rundir.write_history(tmp_path, [{"epoch": e, "loss": 1.0 / e} for e in (1, 2, 3)])
    assert [e["epoch"] for e in rundir.read_history(tmp_path, 2)] == [1, 2]


def test_two_runs_claiming_one_fresh_folder_at_once_one_is_refused(tmp_path: Path) -> None:
    # Both inspected the folder before either claimed it (two `mgpu train` started together).
    first = rundir.inspect_run_folder(tmp_path / "run", IDENTITY)
    second = rundir.inspect_run_folder(tmp_path / "run", IDENTITY)
    rundir.claim_run_folder(first, IDENTITY)
    with pytest.raises(ConfigError, match="claimed by another run"):
        rundir.claim_run_folder(second, IDENTITY)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["run.json"]


def test_a_hand_edited_history_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / rundir.HISTORY_FILE).write_text('{"epochs": [{"epoch": "two"}]}')
    with pytest.raises(ConfigError, match="not a number"):
        rundir.read_history(tmp_path, 2)
