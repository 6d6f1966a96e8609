"""The run folder (OUTPUT_DIR): where it is and what it holds.

That is where it is, its layout, its record (run.json), its history, and the latest
checkpoint's position.

Layout:
    run.json        what defines the run (data set, batches, learning rate, seed, precision);
                    a second start with other values is refused rather than mixed in
    checkpoints/    tf.train.CheckpointManager's files: ckpt-<E> at epoch E's end, ckpt-<E>-<S>
                    S steps into the next (CHECKPOINT_EVERY); the 3 latest kept
    history.json    per-epoch loss, accuracy and samples/s, rewritten after every epoch
    settings.json   the settings of the latest start, each with where it came from (a
                    resume takes them where the user sets none: run/resume.py)
    logs/           TensorBoard event files (per-epoch scalars)
    model.keras     the trained model, written once training has finished
    metrics.json    the run's results, written only by a run that finished

Every JSON file and the model are written to a temporary file in the same folder and then
`os.replace`d over the old one (`training.shared.atomic`), which is atomic on POSIX
filesystems: a kill -9 at any moment leaves either the old file or the new one, never half
of one.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.resolve import ResolvedSettings
from mgpu_env.config.settings import DECLARATIONS

# The folder's place is the runtime's decision (one rule for every command); named here too
# for the run's modules that read it with the rest of the folder.
from mgpu_env.runtime.runfolder import run_folder as run_folder

# The atomic writes and the checkpoint phrase live below run/ (input/ uses them too); here
# under their old names for the code that reaches them through the run folder.
from mgpu_env.training.shared.atomic import (  # noqa: F401
    atomic_save,
    atomic_write_json,
    atomic_write_text,
    temp_beside,
)
from mgpu_env.training.shared.messages import checkpoint_kept  # noqa: F401
from mgpu_env.training.shared.position import Position

# The layout of the run folder's JSON files (run.json, history.json, settings.json,
# metrics.json), in each as `schema_version`; raised when a key is removed or changes meaning.
SCHEMA_VERSION = 1
RUN_FILE = "run.json"
METRICS_FILE = "metrics.json"
HISTORY_FILE = "history.json"
SETTINGS_FILE = "settings.json"
MODEL_FILE = "model.keras"
CHECKPOINT_DIR = "checkpoints"
LOG_DIR = "logs"
# The `checkpoint` index file's line naming the latest checkpoint (`ckpt-<epoch>` here).
_LATEST_RE = re.compile(r'^model_checkpoint_path:\s*"(.*)"\s*$', re.MULTILINE)
# Files whose presence marks a folder as an mgpu run (or something we must not overwrite).
_RUN_MARKERS = (RUN_FILE, METRICS_FILE, MODEL_FILE, CHECKPOINT_DIR)


def decide_output_dir(resolved: ResolvedSettings, folder: Path | None = None) -> ResolvedSettings:
    """The settings with the run folder decided, once, when the command starts: OUTPUT_DIR,
    else `folder` (already decided), else runs/<RUN_NAME>, else runs/<UTC timestamp>. The
    clock is read here only: every part of the run then reads `settings.output_dir`, so
    they agree even when a second passes. The provenance keeps OUTPUT_DIR as asked."""
    settings = resolved.settings
    if settings.output_dir is not None:
        return resolved
    return resolved.filled_in("OUTPUT_DIR", folder or run_folder(settings))


def finished_as_asked(metrics: Mapping[str, Any] | None, epochs: int) -> bool:
    """Whether a finished run's metrics.json says it trained `epochs` epochs: a start that
    asks for them has nothing to train. Part of the one test of "already finished"
    (`finished.finished_in`)."""
    return metrics is not None and metrics.get("epochs_completed") == epochs


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when the file is absent. ConfigError if unreadable."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{path} cannot be read ({err}).\n"
            "  Fix: choose another OUTPUT_DIR, or move this folder away."
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a JSON object. Fix: choose another OUTPUT_DIR.")
    return data


@dataclass(frozen=True)
class RunFolder:
    """What OUTPUT_DIR holds before a run starts."""

    path: Path
    exists: bool
    identity: dict[str, Any] | None  # run.json's identity, None for a fresh folder
    finished_metrics: dict[str, Any] | None  # metrics.json of a finished run, if any
    data: dict[str, Any] | None = None  # run.json's record of the data (`dataid`), if any

    @property
    def fresh(self) -> bool:
        return self.identity is None

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR


def inspect_run_folder(path: Path, identity: Mapping[str, Any]) -> RunFolder:
    """Check that OUTPUT_DIR is empty, new, or a run with the same identity. Writes nothing.

    Raises ConfigError (exit 2) for a folder that holds another run, or files that an mgpu
    run would overwrite without being one.
    """
    if not path.exists():
        return RunFolder(path, False, None, None)
    if not path.is_dir():
        raise ConfigError(f"OUTPUT_DIR={path} is a file, not a folder. Fix: choose a folder.")
    stored = read_json(path / RUN_FILE)
    if stored is None:
        present = [name for name in _RUN_MARKERS if (path / name).exists()]
        if present:
            raise ConfigError(
                f"OUTPUT_DIR={path} holds {', '.join(present)} but no {RUN_FILE}, so it is not "
                "a run this version can resume.\n  Fix: choose another OUTPUT_DIR (or RUN_NAME)."
            )
        return RunFolder(path, True, None, None)
    previous = stored.get("identity")
    if not isinstance(previous, dict):
        raise ConfigError(f"{path / RUN_FILE} has no identity. Fix: choose another OUTPUT_DIR.")
    differences = identity_differences(previous, identity)
    if differences:
        raise ConfigError(changed_settings_message(path, differences))
    metrics = read_json(path / METRICS_FILE)
    finished = metrics if metrics and metrics.get("status") == "finished" else None
    data = stored.get("data")
    return RunFolder(path, True, dict(previous), finished,
                     dict(data) if isinstance(data, dict) else None)


# The identity key a change of replicas moves when the global batch stays: BATCH_SIZE (per
# replica) x replicas is the batch the run trains, and the feed gives global batch b the
# same rows whatever the replicas, so 4 x 64 and 2 x 128 train the same run (its losses
# differ by the all-reduce's rounding only).
PER_REPLICA_KEY = "per_replica_batch_size"
GLOBAL_KEY = "global_batch_size"


def identity_differences(previous: Mapping[str, Any], identity: Mapping[str, Any]) -> list[str]:
    """What differs between a folder's run identity and this start's, as a resume refuses
    it (each setting with both values): every key, but the per-replica batch where the
    global batch is kept (other replicas, the same run)."""
    same_global = GLOBAL_KEY in previous and previous.get(GLOBAL_KEY) == identity.get(GLOBAL_KEY)
    return [
        f"{_setting_of(key)}: {previous.get(key)!r} there, {identity.get(key)!r} now"
        for key in sorted(set(previous) | set(identity))
        if previous.get(key) != identity.get(key)
        and not (key == PER_REPLICA_KEY and same_global)
    ]


def _setting_of(key: str) -> str:
    """The setting an identity key holds (the global batch: the product of three)."""
    for declaration in DECLARATIONS:
        if declaration.identity == key:
            return declaration.env
    if key == GLOBAL_KEY:
        return "the global batch (BATCH_SIZE x replicas: GPUS, VIRTUAL_DEVICES, workers)"
    return key


def changed_settings_message(path: Path, differences: list[str]) -> str:
    """A resume that would change what the run trains: each setting with both values, what
    a resume may and may not change (the settings' declared roles), and the fix."""
    fixed = [d.env for d in DECLARATIONS if "identity" in d.roles]
    free = [d.env for d in DECLARATIONS if "resumed" in d.roles and "identity" not in d.roles]
    return (
        f"OUTPUT_DIR={path} holds a run these settings would change ({'; '.join(differences)})"
        ": resuming it would mix two runs. A resume may change "
        f"{', '.join(free)} (EPOCHS only up, the devices only to the same global batch, "
        "BATCH_SIZE with them); "
        f"otherwise not {', '.join(fixed)}.\n"
        "  Fix: resume it with its own values (leave them unset: the folder's record "
        "stands in), or train these settings as a new run: another RUN_NAME or OUTPUT_DIR."
    )


def claim_run_folder(folder: RunFolder, identity: Mapping[str, Any],
                     data: Mapping[str, Any] | None = None) -> None:
    """Create the folder and write run.json (a fresh folder), with the data's identity
    (`dataid`); a run.json without that record (an older mgpu's) gets it now."""
    folder.path.mkdir(parents=True, exist_ok=True)
    if not folder.fresh:
        stored = read_json(folder.path / RUN_FILE)
        if data is not None and stored is not None and "data" not in stored:
            atomic_write_json(folder.path / RUN_FILE, {**stored, "data": dict(data)})
        return
    record = {
        "schema_version": SCHEMA_VERSION,
        "run_id": uuid.uuid4().hex,
        "identity": dict(identity),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **({"data": dict(data)} if data is not None else {}),
    }
    path = folder.path / RUN_FILE
    handle, temp = temp_beside(path, ".tmp")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(json.dumps(record, indent=2) + "\n")
        out.flush()
        os.fsync(out.fileno())
    try:
        # link() fails if run.json exists: of two runs started on one fresh folder at
        # once, exactly one claims it, and the other is refused rather than mixed in.
        os.link(temp, path)
    except FileExistsError:
        raise ConfigError(
            f"OUTPUT_DIR={folder.path} was claimed by another run that started at the same "
            "time.\n  Fix: choose another OUTPUT_DIR (or RUN_NAME), or wait for that run and "
            "start again to resume it."
        ) from None
    finally:
        Path(temp).unlink(missing_ok=True)


def read_history(folder: Path, epochs_done: int) -> list[dict[str, Any]]:
    """The per-epoch history of the epochs the restored checkpoint covers."""
    data = read_json(folder / HISTORY_FILE)
    entries = data.get("epochs", []) if data else []
    try:
        return [
            e for e in entries if isinstance(e, dict) and int(e.get("epoch", 0)) <= epochs_done
        ]
    except (TypeError, ValueError):
        raise ConfigError(
            f"{folder / HISTORY_FILE} has an epoch that is not a number.\n"
            "  Fix: restore the file, or choose another OUTPUT_DIR."
        ) from None


def write_history(folder: Path, history: list[dict[str, Any]]) -> None:
    """history.json with the run's id; a history `--resume-from` started after set-aside
    epochs keeps saying where it starts (`first_epoch`)."""
    record: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "epochs": history}
    try:
        previous = json.loads((folder / HISTORY_FILE).read_text(encoding="utf-8"))
        first = previous.get("first_epoch") if isinstance(previous, dict) else None
    except (OSError, ValueError):
        first = None
    if isinstance(first, int) and first > 1 and not any(
            e.get("epoch", first) < first for e in history):
        record["first_epoch"] = first
    if (run_id := run_id_of(folder)) is not None:
        record["run_id"] = run_id
    atomic_write_json(folder / HISTORY_FILE, record)


def run_id_of(folder: Path) -> str | None:
    """The run's id (run.json's `run_id`), that settings.json and history.json repeat, so
    a record copied from another run is seen (`state`); None for a run of an mgpu before
    run ids, or a run.json that cannot be read."""
    try:
        record = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = record.get("run_id") if isinstance(record, dict) else None
    return value if isinstance(value, str) else None


def latest_checkpoint_position(output_dir: Path) -> Position | None:
    """Where the latest checkpoint in `output_dir` stands, read from the `checkpoint` index
    file tf.train.CheckpointManager keeps (a text-format CheckpointState whose
    `model_checkpoint_path` names the latest, `Position.name`),
    without TensorFlow: the one reader of it (the plan's resume position, the "nothing to
    do" answer; the loop's CheckpointManager then restores that checkpoint). None when there
    is no index or it cannot be read. ConfigError for a name mgpu does not write."""
    directory = output_dir / CHECKPOINT_DIR
    try:
        text = (directory / "checkpoint").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    found = _LATEST_RE.search(text)
    if found is None:
        return None
    latest = Path(found.group(1))
    latest = latest if latest.is_absolute() else directory / latest
    position = Position.parse(latest.name)
    if position is None:
        raise ConfigError(
            f"{latest} is not a checkpoint mgpu wrote. Fix: choose another OUTPUT_DIR."
        ) from None
    return position


def latest_checkpoint_epoch(output_dir: Path) -> int | None:
    """The epochs completed at the latest checkpoint in `output_dir` (a checkpoint inside
    an epoch counts the epochs before it); None when there is none."""
    position = latest_checkpoint_position(output_dir)
    return None if position is None else position.epoch
