"""`mgpu train --resume-from ckpt-E[-S]`: the way out of a run folder `state` refused.

The checkpoint named must be complete here (`bundle.check_bundle`). Then, in the held run
folder: whatever would contradict resuming from it is moved into `set-aside/<UTC time>/`
(nothing is deleted): the checkpoint index, the checkpoints after it and those that are
damaged, and each JSON record that is damaged or names another run; a new index names the
checkpoint as the latest (and the complete ones before it, as CheckpointManager keeps
them). run.json, when set aside, is written again with this start's identity and the
run's id; history.json, when set aside or short of the checkpoint's epochs, starts again
after them (`first_epoch`). The plan then checks the folder as for any resume. Done once:
the same command again on a folder that now resumes as it is (a launcher's restart with
`--workers`, a requeued job) changes nothing.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.run import rundir
from mgpu_env.training.run.checkpoints import CHECKPOINTS_KEPT
from mgpu_env.training.run.state import (
    INDEX_FILE,
    Checkpoint,
    DamagedRunFolder,
    _epochs_recorded,
    _json,
    check_run_state,
    checkpoints_on_disk,
    newest_good,
)
from mgpu_env.training.shared.position import Position

SET_ASIDE_DIR = "set-aside"
DONE_FILE = "resume-from.json"  # in its set-aside folder: what a --resume-from did


def resume_from_checkpoint(folder: Path, name: str, identity: Mapping[str, Any]) -> list[str]:
    """Make `folder` resume from its checkpoint `name`; the lines that say what was set
    aside. Raises ConfigError when `name` is not a complete checkpoint of the folder."""
    directory = folder / rundir.CHECKPOINT_DIR
    done = _done_before(folder, name)
    if done is not None:
        return [f"--resume-from {name}: done before ({done}); the run folder resumes as it is"]
    on_disk = checkpoints_on_disk(directory)
    chosen = next((c for c in on_disk if c.name == name), None)
    if Position.parse(name) is None or chosen is None or chosen.problem is not None:
        good = newest_good(on_disk)
        why = ("is not a checkpoint's name (ckpt-E, or ckpt-E-S inside an epoch)"
               if Position.parse(name) is None else
               f"is not in {directory}" if chosen is None else f"cannot be used: {chosen.problem}")
        best = f" The newest complete one: {good.name}." if good is not None else (
            " No complete checkpoint is left there.")
        raise ConfigError(f"--resume-from {name} {why}.{best}\n  Fix: --resume-from a "
                          "complete checkpoint, or train anew with another RUN_NAME.")
    aside = folder / SET_ASIDE_DIR / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    moved: list[str] = []
    run_id = _records_aside(folder, aside, chosen, identity, moved)
    later = [c for c in on_disk if c.problem is not None or
             c.position > chosen.position]
    for checkpoint in later:
        for path in directory.glob(checkpoint.name + ".*"):
            _move(path, aside / rundir.CHECKPOINT_DIR, moved, folder)
    if (directory / INDEX_FILE).exists():
        _move(directory / INDEX_FILE, aside / rundir.CHECKPOINT_DIR, moved, folder)
    kept = [c for c in on_disk if c not in later][-CHECKPOINTS_KEPT:]
    _write_index(directory, kept)
    if not (folder / rundir.HISTORY_FILE).exists():
        rundir.atomic_write_json(folder / rundir.HISTORY_FILE, {
            "schema_version": rundir.SCHEMA_VERSION, "run_id": run_id,
            "first_epoch": chosen.position.epoch + 1, "epochs": []})
    aside.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_json(aside / DONE_FILE, {"checkpoint": name})
    return [f"--resume-from {name}: set aside in {aside}: {', '.join(moved) or 'nothing'}"]


def _done_before(folder: Path, name: str) -> Path | None:
    """Where a `--resume-from name` was done already, when the folder now resumes as it is:
    the same command again (a launcher's restart, a requeued job's script) then changes
    nothing, rather than set aside what was trained since."""
    marks = sorted((folder / SET_ASIDE_DIR).glob(f"*/{DONE_FILE}"))
    if not any(_named(mark) == name for mark in marks):
        return None
    try:
        check_run_state(folder)
    except DamagedRunFolder:
        return None
    return next(mark.parent for mark in reversed(marks) if _named(mark) == name)


def _named(mark: Path) -> str | None:
    try:
        value = json.loads(mark.read_text(encoding="utf-8")).get("checkpoint")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _records_aside(folder: Path, aside: Path, chosen: Checkpoint,
                   identity: Mapping[str, Any], moved: list[str]) -> str:
    """Set aside each JSON record that is damaged, of another run, or (history) short of
    the checkpoint's epochs; write run.json again when it went. The run's id."""
    records: dict[str, dict[str, Any] | None] = {}
    for name in (rundir.RUN_FILE, rundir.SETTINGS_FILE, rundir.HISTORY_FILE,
                 rundir.METRICS_FILE):
        try:
            records[name] = _json(folder, name, [])
        except DamagedRunFolder:
            _move(folder / name, aside, moved, folder)
            records[name] = None
    run = records[rundir.RUN_FILE]
    if run is not None and not isinstance(run.get("identity"), dict):
        _move(folder / rundir.RUN_FILE, aside, moved, folder)
        run = None
    ids = [r.get("run_id") for r in records.values() if r is not None and r.get("run_id")]
    majority = max(set(ids), key=ids.count) if ids else None
    run_id = str(majority or uuid.uuid4().hex)
    for name, record in records.items():
        if record is not None and name != rundir.RUN_FILE and record.get("run_id") not in (
                None, run_id):
            _move(folder / name, aside, moved, folder)
            records[name] = None
    history = records[rundir.HISTORY_FILE]
    if history is not None:
        try:
            recorded = _epochs_recorded(folder, history, [])
        except DamagedRunFolder:
            recorded = None
        if (recorded or 0) < chosen.position.epoch:
            _move(folder / rundir.HISTORY_FILE, aside, moved, folder)
    if records[rundir.METRICS_FILE] is not None:
        _move(folder / rundir.METRICS_FILE, aside, moved, folder)  # an earlier point's end
    if run is None or run.get("run_id", run_id) != run_id:
        if run is not None:
            _move(folder / rundir.RUN_FILE, aside, moved, folder)
        rundir.atomic_write_json(folder / rundir.RUN_FILE, {
            "schema_version": rundir.SCHEMA_VERSION, "run_id": run_id,
            "identity": dict(identity),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "rewritten_by": "--resume-from"})
    return run_id


def _move(path: Path, into: Path, moved: list[str], folder: Path) -> None:
    if not path.exists():
        return
    into.mkdir(parents=True, exist_ok=True)
    os.replace(path, into / path.name)
    moved.append(str(path.relative_to(folder)))


def _write_index(directory: Path, kept: list[Checkpoint]) -> None:
    """The index CheckpointManager reads: the latest, and the kept ones with their times."""
    stamps = [(directory / f"{c.name}.index").stat().st_mtime for c in kept]
    lines = [f'model_checkpoint_path: "{kept[-1].name}"']
    lines += [f'all_model_checkpoint_paths: "{c.name}"' for c in kept]
    lines += [f"all_model_checkpoint_timestamps: {stamp}" for stamp in stamps]
    lines.append(f"last_preserved_timestamp: {min(stamps)}")
    rundir.atomic_write_text(directory / INDEX_FILE, "\n".join(lines) + "\n")
