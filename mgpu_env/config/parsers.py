"""Parsers: each turns the text of one setting into its value or says why it cannot.

Parsers: each turns the text of a setting into its value, or raises SettingError saying why the
text is wrong; `mgpu_env.config.settings` adds the setting's name, the value, where it came
from and what is valid. Pure functions, tested on their own."""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mgpu_env.config.text import (  # SettingError re-exported: the parsers' error
    MOST_DIGITS,
    SettingError,
    decimal_number,
    is_digits,
    path_kind,
    path_of,
    plain,
    shown,
    whole_number,
)

# --------------------------------------------------------------------------- parsers
# Each parser turns the text of a setting into its value, or raises SettingError whose
# message says why the text is wrong; the caller adds the setting's name, the value, where
# it came from and what is valid.


def parse_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = whole_number(text)
        if value is None:
            raise SettingError("not a whole number (digits 0-9)")
        if not low <= value <= high:
            raise SettingError(f"out of range {low}..{high}")
        return value

    return parse


def parse_positive_float(high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = decimal_number(text)
        if value is None:
            raise SettingError("not a number (digits 0-9, like 0.5 or 1e-3)")
        if not (math.isfinite(value) and 0 < value <= high):
            raise SettingError(f"must be above 0 and at most {high:g}")
        return value

    return parse


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SettingError("not a yes/no value")


def did_you_mean(text: str, choices: tuple[str, ...]) -> str:
    """`; did you mean mnist?` for a near miss (`mnsit`), else nothing."""
    close = difflib.get_close_matches(text, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        lowered = text.strip().lower()
        if lowered not in choices:
            raise SettingError("not one of the choices" + did_you_mean(lowered, choices))
        return lowered

    return parse


def parse_optional_dir_must_exist(text: str) -> Path | None:
    if not text.strip():
        return None
    path = path_of(text)
    kind = path_kind(path)
    if kind is None:
        raise SettingError(f"the folder {shown(path)} does not exist")
    if kind != "folder":
        raise SettingError(f"{shown(path)} is a file, not a folder")
    return path


def parse_optional_output_dir(text: str) -> Path | None:
    if not text.strip():
        return None
    path = path_of(text)
    if path_kind(path) not in (None, "folder"):
        raise SettingError(f"{shown(path)} is a file, not a folder")
    # A missing folder is fine (it is created), but its nearest existing parent must be one.
    for parent in path.absolute().parents:
        kind = path_kind(parent)
        if kind is not None:
            if kind != "folder":
                raise SettingError(f"{shown(parent)} is a file, so {shown(path)} cannot be "
                                   "created")
            break
    return path


def parse_optional_env_file(text: str) -> Path | None:
    if not text.strip():
        return None
    path = path_of(text)
    kind = path_kind(path)
    if kind != "file":
        reason = "does not exist" if kind is None else "is not a file"
        raise SettingError(f"the file {shown(path)} {reason}")
    return path


_RUN_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def parse_run_name(text: str) -> str:
    # One folder under runs/: a '/' or '..' would put the run (and its overwrite checks)
    # somewhere else; OUTPUT_DIR is the setting for that.
    name = text.strip()
    if name and not _RUN_NAME_RE.fullmatch(name):
        raise SettingError("not a plain folder name (use OUTPUT_DIR for a path)")
    return name


_UUID_RE = re.compile(r"(GPU|MIG)-[0-9A-Fa-f-]{4,}")


@dataclass(frozen=True)
class GpuRequest:
    """What `GPUS` asks for: every GPU, none, indices in nvidia-smi order, or UUIDs."""

    kind: Literal["all", "none", "indices", "uuids"]
    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.kind in ("all", "none"):
            return self.kind
        return ",".join(str(i) for i in self.indices) if self.kind == "indices" else ",".join(
            self.uuids
        )


def parse_gpus(text: str) -> GpuRequest:
    lowered = text.strip().lower()
    if lowered in ("all", ""):
        return GpuRequest("all")
    if lowered in ("none", "cpu"):
        return GpuRequest("none")
    items = [item.strip() for item in text.split(",")]
    if any(not item for item in items):
        raise SettingError("the list has an empty item")
    if all(is_digits(item) for item in items):
        indices = tuple(whole_number(item) or 0 for item in items)  # digits: never None
        if max(indices) >= 10**MOST_DIGITS:
            raise SettingError("an index has more digits than any GPU count")
        duplicates = sorted({i for i in indices if indices.count(i) > 1})
        if duplicates:
            raise SettingError(f"index {duplicates[0]} is listed twice")
        return GpuRequest("indices", indices=indices)
    if any(item.upper().startswith("MIG-") for item in items):
        # CUDA gives one process at most one MIG instance, so MirroredStrategy cannot span
        # them, and NVML lists whole GPUs: a MIG UUID would match nothing below.
        raise SettingError("MIG instances cannot be selected; use whole GPUs (indices or GPU-…)")
    if all(_UUID_RE.fullmatch(item) for item in items):
        if len(set(items)) != len(items):
            raise SettingError("a UUID is listed twice")
        return GpuRequest("uuids", uuids=tuple(items))
    bad = next((i for i in items if not is_digits(i) and not _UUID_RE.fullmatch(i)), None)
    if bad is None:
        raise SettingError("indices and UUIDs cannot be mixed")
    if bad.startswith("-") and is_digits(bad[1:]):
        raise SettingError(f"{shown(bad)} is not a GPU index (indices start at 0)")
    raise SettingError(f"{shown(bad)} is neither a GPU index nor a GPU UUID")


_HOOK_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


def is_hook(text: str) -> bool:
    """Whether a MODEL/DATASET value names the user's function (`package.module:function`)."""
    return ":" in text


def parse_name_or_hook(*names: str) -> Callable[[str], str]:
    """One of `names`, or `package.module:function` (imported later, when it is used)."""

    def parse(text: str) -> str:
        stripped = text.strip()
        if is_hook(stripped):
            if not _HOOK_RE.fullmatch(stripped):
                raise SettingError(
                    "not package.module:function (dotted module name, a colon, a function name)"
                )
            return stripped
        lowered = stripped.lower()
        if lowered not in names:
            raise SettingError(
                "not one of the choices, nor package.module:function" + did_you_mean(lowered, names)
            )
        return lowered

    return parse


# DATASET=kind:DIR reads a folder of files (training/input/data/files.py); checked before "hook".
FILE_DATASET_KINDS = ("tfrecord", "images", "npy")


def file_dataset(text: str) -> tuple[str, Path] | None:
    """(kind, folder) for `tfrecord:DIR`, `images:DIR` or `npy:DIR`; None for other values."""
    kind, colon, folder = text.strip().partition(":")
    if not colon or kind.lower() not in FILE_DATASET_KINDS:
        return None
    return kind.lower(), path_of(folder)


def folder_kind(folder: Path) -> str | None:
    """The kind of files a folder given without one holds, judged by their names only
    (`npy` for x_train.npy, `images` for train/<class>/ folders, `tfrecord` for
    *.tfrecord*); None for a folder that holds none of these."""
    if path_kind(folder / "x_train.npy") == "file":
        return "npy"
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:  # a folder that cannot be listed holds nothing it can tell
        names = []
    if any(".tfrecord" in name or name.endswith(".tfrec") for name in names):
        return "tfrecord"
    if path_kind(folder / "train") == "folder":
        return "images"
    return None


def parse_dataset(*names: str) -> Callable[[str], str]:
    """One of `names`, `kind:DIR` (a folder of files that must exist), or
    `package.module:function`."""
    by_name = parse_name_or_hook(*names)

    def parse(text: str) -> str:
        files = file_dataset(text)
        if files is None:
            if text.strip().lower() in names or is_hook(text):
                return by_name(text)
            folder = path_of(text)
            if path_kind(folder) == "folder":
                kind = folder_kind(folder)
                raise SettingError(
                    "a folder, without the kind of its files; "
                    + (f"did you mean {kind}:{plain(text.strip())}?" if kind else
                       f"put tfrecord:, images: or npy: before it ({shown(folder)} holds no "
                       "x_train.npy, *.tfrecord* files or train/ folder)")
                )
            return by_name(text)
        kind, folder = files
        if not str(folder) or path_kind(folder) != "folder":
            raise SettingError(f"{kind}: needs an existing folder; {shown(folder)} is not one")
        return f"{kind}:{folder}"

    return parse


def parse_replica_counts(text: str) -> tuple[int, ...]:
    """`auto` (empty tuple: decided from the devices) or a comma list of counts from 1 to 64."""
    if text.strip().lower() in ("auto", ""):
        return ()
    counts = []
    for item in text.split(","):
        count = whole_number(item) if is_digits(item.strip()) else None
        if count is None or not 1 <= count <= 64:
            raise SettingError(f"{shown(item.strip())} is not a replica count from 1 to 64")
        counts.append(count)
    return tuple(sorted(set(counts)))


def parse_choice_list(*choices: str) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        items = [item.strip().lower() for item in text.split(",") if item.strip()]
        bad = [item for item in items if item not in choices]
        if bad:
            raise SettingError(
                f"{shown(bad[0])} is not one of the choices" + did_you_mean(bad[0], choices)
            )
        return tuple(dict.fromkeys(items))

    return parse


def parse_worker_hosts(text: str) -> tuple[str, ...]:
    """Empty (one process), or a comma list of host:port, one per worker, the chief first."""
    items = [item.strip() for item in text.split(",")] if text.strip() else []
    for item in items:
        host, _, port = item.rpartition(":")
        if not item:
            raise SettingError("the list has an empty item")
        number = whole_number(port) if is_digits(port) else None
        if not host or number is None or not 1 <= number <= 65535:
            raise SettingError(f"{shown(item)} is not host:port (a port from 1 to 65535)")
    duplicates = sorted({item for item in items if items.count(item) > 1})
    if duplicates:
        raise SettingError(f"{shown(duplicates[0])} is listed twice")
    return tuple(items)


def parse_optional_index(text: str) -> int | None:
    if not text.strip():
        return None
    return parse_int(0, 1023)(text)


def parse_tf_config(text: str) -> str:
    """TF_CONFIG as TensorFlow reads it; checked here so a typo fails in milliseconds.

    Returns the text unchanged (TensorFlow parses it again); empty means one process.
    """
    if not text.strip():
        return ""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise SettingError(f"not JSON ({err})") from None
    except (ValueError, RecursionError):  # what Python's reader cannot hold
        raise SettingError("JSON that cannot be read: a number of more than 4,300 digits, "
                           "or lists nested too deep") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise SettingError('it has no "cluster" object')
    cluster = config["cluster"]
    # "master" is the chief under another name (Kubeflow's TFJob operator writes it).
    unsupported = sorted(set(cluster) - {"chief", "master", "worker"})
    if unsupported:
        # A "ps" (or "evaluator") job is a parameter-server cluster: another strategy, not a
        # TF_CONFIG to correct, so the message says what mgpu runs rather than "fix it".
        raise SettingError(
            f'it has a "{plain(unsupported[0])}" job, as a parameter-server cluster '
            "(ParameterServerStrategy) has; mgpu runs MultiWorkerMirroredStrategy clusters "
            'only, whose TF_CONFIG lists "chief" (or "master") and "worker" tasks. Run a '
            "parameter-server job with python itself, without mgpu"
        )
    if "chief" in cluster and "master" in cluster:
        raise SettingError('it has both a "chief" and a "master" job; only one can lead')
    for job, addresses in cluster.items():
        if not isinstance(addresses, list) or not addresses:
            raise SettingError(f'cluster "{job}" must be a non-empty list of "host:port"')
        if not all(isinstance(a, str) for a in addresses):
            raise SettingError(f'cluster "{job}" must list "host:port" strings')
        try:
            parse_worker_hosts(",".join(addresses))
        except SettingError as err:
            raise SettingError(f'cluster "{job}": {err}') from None
    for lead in ("chief", "master"):
        if len(cluster.get(lead, [])) > 1:
            raise SettingError(f'cluster "{lead}" can have only one address')
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise SettingError('it has no "task": {"type": ..., "index": ...}')
    task_type, index = task["type"], task["index"]
    if not isinstance(task_type, str) or task_type not in cluster:
        raise SettingError(f"task type {shown(json.dumps(task_type))} is not a job of the "
                           "cluster")
    if (not isinstance(index, int) or isinstance(index, bool)
            or not 0 <= index < len(cluster[task_type])):
        raise SettingError(f"task index {shown(json.dumps(index))} is not "
                           f'0..{len(cluster[task_type]) - 1} for "{task_type}"')
    return text.strip()




@dataclass(frozen=True)
class CheckpointInterval:
    """What `CHECKPOINT_EVERY` asks for: a checkpoint every `steps` steps, every `seconds`
    seconds, or (neither) only at each epoch's end. `str()` gives the setting's text back."""

    steps: int = 0
    seconds: float = 0.0

    @property
    def only_epochs(self) -> bool:
        return not self.steps and not self.seconds

    def describe(self) -> str:
        """When checkpoints are saved, in words (the start summary, --dry-run)."""
        if self.only_epochs:
            return f"at each epoch's end only (CHECKPOINT_EVERY={self})"
        every = f"{self.steps:,} steps" if self.steps else f"{self}"
        return f"every {every} (CHECKPOINT_EVERY={self}) and at each epoch's end"

    def __str__(self) -> str:
        if self.steps:
            return str(self.steps)
        if not self.seconds:
            return "epoch"
        for unit, size in (("h", 3600), ("m", 60)):
            if self.seconds % size == 0:
                return f"{int(self.seconds // size)}{unit}"
        return f"{self.seconds:g}s"


_TIME_UNITS = {"s": 1, "m": 60, "h": 3600}
# A week: beyond that an interval is a mistake (a unit typed as the wrong letter).
_MOST_SECONDS = 7 * 86_400
_MOST_STEPS = 1_000_000_000


def parse_checkpoint_every(text: str) -> CheckpointInterval:
    """`0` or `epoch`: at epoch ends only; a whole number N: every N steps; a time (`90s`,
    `10m`, `1.5h`): at the first call boundary once that long has passed since the last."""
    lowered = text.strip().lower()
    if lowered in ("0", "epoch"):
        return CheckpointInterval()
    if is_digits(lowered):
        steps = whole_number(lowered)
        assert steps is not None  # digits are a whole number
        if steps > _MOST_STEPS:
            raise SettingError(f"more than {_MOST_STEPS:,} steps")
        return CheckpointInterval(steps=steps)
    unit = _TIME_UNITS.get(lowered[-1:]) if lowered else None
    if unit is None:
        raise SettingError("neither a number of steps nor a time ending in s, m or h")
    number = decimal_number(lowered[:-1])
    if number is None:
        raise SettingError(f"{shown(lowered[:-1])} before the unit is not a number")
    seconds = number * unit
    if not (math.isfinite(seconds) and 1 <= seconds <= _MOST_SECONDS):
        raise SettingError("a time must be at least 1s and at most 168h (a week)")
    return CheckpointInterval(seconds=seconds)
