"""A run folder's state, read as untrusted input before a run resumes it.

Every file the resume reads is checked, and checked against the others: run.json (the
run's identity and id), settings.json, history.json and metrics.json (JSON of the shape
mgpu writes, of this run: the same `run_id`), the checkpoint index `checkpoints/checkpoint`
(text TensorFlow can parse, naming a checkpoint mgpu writes, in this folder) and the
checkpoint it names (`bundle.check_bundle`: every file there, every checksum agreeing);
history.json must record every epoch the checkpoint has completed (it is written before
each epoch's checkpoint). Nothing here imports TensorFlow.

A file that is damaged, missing or disagreeing is refused (`DamagedRunFolder`, exit 2) with
the file, what is wrong, the newest complete checkpoint still good and the one command that
resumes from it (`--resume-from`, `repair.py`), never taken as "nothing there": a fresh
start over kept checkpoints would replace them. A checkpoint written after the index's
latest (a save stopped by kill -9 before its index was replaced) is left alone: the index's
latest is the one resumed, as TensorFlow itself would.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env.config.errors import ConfigError
from mgpu_env.training.run import rundir
from mgpu_env.training.run.bundle import check_bundle
from mgpu_env.training.shared.position import Position

INDEX_FILE = "checkpoint"
_PATH_LINE = re.compile(r'^(model_checkpoint_path|all_model_checkpoint_paths):\s*"(.*)"\s*$')
_OTHER_LINE = re.compile(
    r"^(all_model_checkpoint_timestamps|last_preserved_timestamp):\s*[-+0-9.eE]+\s*$")
_BUNDLE_FILE = re.compile(r"(ckpt-[^.]+)\.(?:index|data-\d{5}-of-\d{5})")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint found on disk: its name, its position and what is wrong with it."""

    name: str
    position: Position
    problem: str | None  # None: complete, every checksum agreeing


class DamagedRunFolder(ConfigError):
    """A run folder file that is damaged, missing or disagrees with the others (exit 2)."""

    def __init__(self, folder: Path, file: str, what: str, good: Checkpoint | None) -> None:
        self.folder, self.file, self.good = folder, file, good
        super().__init__(damage_message(folder, file, what, good))


def damage_message(folder: Path, file: str, what: str, good: Checkpoint | None) -> str:
    """The refusal: the file, what is wrong, the newest good checkpoint and the way on."""
    head = f"The run folder {folder} cannot be resumed as it is: {file} {what}."
    if good is None:
        return (f"{head}\n  No complete checkpoint is left in {folder / rundir.CHECKPOINT_DIR}."
                "\n  Fix: train anew with another RUN_NAME or OUTPUT_DIR (move this folder "
                "away to keep it).")
    return (
        f"{head}\n  The newest complete checkpoint still good: {good.name} "
        f"({good.position.describe()}).\n"
        f"  Resume from it: OUTPUT_DIR={folder} mgpu train --resume-from {good.name}\n"
        "  (it sets the damaged or later files aside in set-aside/, deleting nothing)"
    )


def checkpoints_on_disk(directory: Path) -> list[Checkpoint]:
    """Every checkpoint whose files are in `directory`, oldest first, each checked."""
    names: dict[str, Position] = {}
    if directory.is_dir():
        for path in directory.iterdir():
            found = _BUNDLE_FILE.fullmatch(path.name)
            if found is not None and (position := Position.parse(found.group(1))) is not None:
                names[found.group(1)] = position
    found_all = [Checkpoint(name, position, check_bundle(directory / name))
                 for name, position in names.items()]
    return sorted(found_all, key=lambda c: c.position)


def newest_good(checkpoints: list[Checkpoint], before: Position | None = None
                ) -> Checkpoint | None:
    """The newest complete checkpoint (before `before`: the one that failed)."""
    for checkpoint in reversed(checkpoints):
        p = checkpoint.position
        if checkpoint.problem is not None:
            continue
        if before is not None and p >= before:
            continue
        return checkpoint
    return None


def read_index(directory: Path) -> tuple[str | None, str | None]:
    """The latest checkpoint's name the index names, or (None, what is wrong with it);
    (None, None) when there is no index."""
    path = directory / INDEX_FILE
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    except UnicodeDecodeError:
        return None, "is not text (bytes that are not UTF-8)"
    latest = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or _OTHER_LINE.match(line):
            continue
        found = _PATH_LINE.match(line)
        if found is None:
            return None, f"is damaged: line {number} is not a checkpoint index's"
        if found.group(1) == "model_checkpoint_path":
            latest = found.group(2)
    if latest is None:
        return None, "is empty" if not text.strip() else "names no latest checkpoint"
    named = Path(latest)
    if named.is_absolute() and named.parent != directory:
        return None, f"names a checkpoint in another folder ({latest})"
    if Position.parse(named.name) is None:
        return None, f"names {latest}, not a checkpoint mgpu writes"
    return named.name, None


@dataclass(frozen=True)
class RunState:
    """What a checked run folder holds: where its latest checkpoint stands (the start
    for none) and the run's id (None for a folder of an mgpu before run ids)."""

    position: Position
    run_id: str | None


def check_run_state(folder: Path) -> RunState:
    """Check every file of the run folder `folder` (which exists) and how they agree;
    raise DamagedRunFolder naming the first that is wrong."""
    directory = folder / rundir.CHECKPOINT_DIR
    on_disk = checkpoints_on_disk(directory)
    records = {name: _json(folder, name, on_disk) for name in
               (rundir.RUN_FILE, rundir.SETTINGS_FILE, rundir.HISTORY_FILE, rundir.METRICS_FILE)}
    run = records[rundir.RUN_FILE]
    if run is None:
        if on_disk:
            raise DamagedRunFolder(folder, rundir.RUN_FILE,
                                   "is missing beside the checkpoints", newest_good(on_disk))
        return RunState(Position(0), None)
    if not isinstance(run.get("identity"), dict):
        raise DamagedRunFolder(folder, rundir.RUN_FILE, "has no run identity",
                               newest_good(on_disk))
    run_id = _check_run_ids(folder, records, on_disk)
    recorded = _epochs_recorded(folder, records[rundir.HISTORY_FILE], on_disk)
    latest, problem = read_index(directory)
    index = f"{rundir.CHECKPOINT_DIR}/{INDEX_FILE}"
    if problem is not None:
        raise DamagedRunFolder(folder, index, problem, newest_good(on_disk))
    if latest is None:
        if on_disk:
            raise DamagedRunFolder(folder, index, "is missing beside the checkpoints",
                                   newest_good(on_disk))
        return RunState(Position(0), run_id)
    named = next((c for c in on_disk if c.name == latest), None)
    position = Position.parse(latest)
    assert position is not None  # read_index checked the name
    if named is None or named.problem is not None:
        what = (f"names {latest}, whose files are not there" if named is None
                else f"names {latest}, and {named.problem}")
        raise DamagedRunFolder(folder, index, what, newest_good(on_disk, position))
    if position.epoch > (recorded or 0):
        what = ("is missing" if recorded is None else f"records {recorded} epoch(s)")
        raise DamagedRunFolder(
            folder, rundir.HISTORY_FILE,
            f"{what}, but the checkpoint {latest} has completed {position.epoch}",
            newest_good(on_disk))
    return RunState(position, run_id)


def _json(folder: Path, name: str, on_disk: list[Checkpoint]) -> dict[str, Any] | None:
    """A JSON record of the run folder: None when absent, refused when not an object."""
    path = folder / name
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as err:
        raise DamagedRunFolder(folder, name, f"cannot be read ({err.strerror})",
                               newest_good(on_disk)) from None
    except UnicodeDecodeError:
        raise DamagedRunFolder(folder, name, "is not text (bytes that are not UTF-8)",
                               newest_good(on_disk)) from None
    except ValueError as err:
        what = "is empty" if not path.stat().st_size else f"is not JSON ({err})"
        raise DamagedRunFolder(folder, name, what, newest_good(on_disk)) from None
    if not isinstance(data, dict):
        raise DamagedRunFolder(folder, name, "does not hold a JSON object",
                               newest_good(on_disk))
    return data


def _check_run_ids(folder: Path, records: dict[str, dict[str, Any] | None],
                   on_disk: list[Checkpoint]) -> str | None:
    """The run id run.json gives; a record that names another is refused (run.json itself
    when the others agree on another)."""
    run = records[rundir.RUN_FILE] or {}
    own = run.get("run_id")
    if own is None:
        return None
    others = {name: r.get("run_id") for name, r in records.items()
              if name != rundir.RUN_FILE and r is not None and r.get("run_id") is not None}
    differ = [name for name, value in others.items() if value != own]
    if not differ:
        return str(own)
    if len(differ) >= 2 and len({others[name] for name in differ}) == 1:
        raise DamagedRunFolder(
            folder, rundir.RUN_FILE,
            f"belongs to another run (run id {own}; {' and '.join(differ)} name "
            f"{others[differ[0]]})", newest_good(on_disk))
    name = differ[0]
    raise DamagedRunFolder(folder, name, f"belongs to another run (run id {others[name]}; "
                           f"run.json's is {own})", newest_good(on_disk))


def _epochs_recorded(folder: Path, history: dict[str, Any] | None,
                     on_disk: list[Checkpoint]) -> int | None:
    """How many epochs, from the first, history.json records without a gap (None: no
    history.json). `first_epoch`: a history whose earlier epochs `--resume-from` set
    aside starts there."""
    if history is None:
        return None
    entries, first = history.get("epochs"), history.get("first_epoch", 1)
    epochs = []
    if isinstance(entries, list) and isinstance(first, int) and first >= 1:
        for entry in entries:
            value = entry.get("epoch") if isinstance(entry, dict) else None
            if not isinstance(value, int) or isinstance(value, bool):
                break
            epochs.append(value)
        else:
            done = first - 1
            while done + 1 in epochs:
                done += 1
            return done
    raise DamagedRunFolder(folder, rundir.HISTORY_FILE,
                           "does not hold a list of epochs, each with its number",
                           newest_good(on_disk))
