"""A resumed run's settings come from its folder's record unless the user sets them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpu_env.training.run.resume import (
    recorded_settings,
    resolve_run_settings,
    resolve_script_settings,
    resume_note,
)


def run_folder(path: Path, settings: dict[str, str], identity: dict[str, object]) -> Path:
    path.mkdir(parents=True)
    record = {name: {"value": value, "source": "env"} for name, value in settings.items()}
    (path / "settings.json").write_text(json.dumps({"settings": record}))
    (path / "run.json").write_text(json.dumps({"identity": identity}))
    return path


def test_the_record_stands_in_for_the_defaults_and_the_user_still_wins(tmp_path: Path) -> None:
    folder = run_folder(tmp_path / "run", {"EPOCHS": "200", "DATASET": "auto", "QUIET": "1"},
                        {"dataset": "digits", "per_replica_batch_size": 64, "seed": 42})
    # QUIET belongs to the start, not the run; `auto` resumes on the data set it chose.
    assert recorded_settings(folder) == {"EPOCHS": "200", "DATASET": "digits"}

    resolved = resolve_run_settings({}, {"OUTPUT_DIR": str(folder)})
    assert resolved.settings.epochs == 200 and resolved.settings.dataset == "digits"
    assert resolved.origin("EPOCHS") == "run folder"
    assert resume_note(resolved) == (
        "resuming with the run folder's recorded settings: EPOCHS=200, DATASET=digits "
        "(a flag or the environment overrides them)"
    )

    resolved = resolve_run_settings({"EPOCHS": "300"}, {"OUTPUT_DIR": str(folder)})
    assert resolved.settings.epochs == 300 and resolved.from_run_folder() == ["DATASET"]


def test_a_fresh_folder_takes_nothing(tmp_path: Path) -> None:
    resolved = resolve_run_settings({}, {"OUTPUT_DIR": str(tmp_path / "new")})
    assert resolved.from_run_folder() == [] and resume_note(resolved) is None
    assert resolved.settings.epochs == 5


def test_a_scripts_settings_decide_the_folder_but_read_no_record(tmp_path: Path) -> None:
    # `mgpu run` and a script's `runtime()`: the folder decided where `mgpu train`'s is,
    # and what a run of `mgpu train` recorded there is not taken.
    folder = run_folder(tmp_path / "run", {"EPOCHS": "200"}, {"seed": 42})
    resolved = resolve_script_settings({}, {"OUTPUT_DIR": str(folder)})
    assert resolved.settings.epochs == 5 and resolved.from_run_folder() == []
    assert resolved.settings.output_dir == folder
    named = resolve_script_settings({}, {"GPUS": "none", "RUN_NAME": "exp"})
    assert named.settings.output_dir == Path("runs/exp")
    stamped = resolve_script_settings({}, {"GPUS": "none"}).settings.output_dir
    assert stamped is not None and stamped.parent == Path("runs")


def test_a_keras_2_run_resumes_with_keras_2(tmp_path: Path) -> None:
    folder = run_folder(tmp_path / "run", {"KERAS": "2", "OUTPUT_DIR": "x"}, {"seed": 42})
    assert recorded_settings(folder) == {"KERAS": "2"}
    resolved = resolve_run_settings({}, {"OUTPUT_DIR": str(folder)})
    assert resolved.settings.keras == "2" and resolved.origin("KERAS") == "run folder"


def test_the_run_folder_is_decided_once_and_shown_as_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mgpu_env.runtime import runfolder
    from mgpu_env.training.run.finished import finished_run
    from mgpu_env.training.run.plan import output_dir_of, plan_training
    from tests.support.runtimes import runtime_of

    monkeypatch.chdir(tmp_path)
    decided: list[str] = []
    clock = iter(range(1_800_000_000, 1_900_000_000, 7))  # every reading 7 s later

    def from_the_clock(run_name: str, now: float | None = None) -> Path:
        decided.append(run_name)
        return real(run_name, next(clock))

    real = runfolder.default_output_dir
    monkeypatch.setattr(runfolder, "default_output_dir", from_the_clock)
    resolved = resolve_run_settings({}, {"GPUS": "none"})
    folder = resolved.settings.output_dir
    assert folder is not None and folder.parent == Path("runs") and decided == [""]
    # What was asked is what the summary, --dry-run --json and settings.json show.
    assert resolved.provenance(["OUTPUT_DIR"]) == {
        "OUTPUT_DIR": {"value": "", "source": "default"}}
    runtime = runtime_of(resolved)
    assert output_dir_of(runtime) == folder and finished_run(runtime) is None
    assert plan_training(runtime, environ={}).output_dir == folder
    assert decided == [""]  # read from the clock once, however late the others ask
    named = resolve_run_settings({}, {"GPUS": "none", "RUN_NAME": "exp"})
    assert named.settings.output_dir == Path("runs/exp")
