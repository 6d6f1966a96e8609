"""The run folder a command writes to, by one rule for every command.

One rule for `mgpu train`, `mgpu run`, `mgpu bench`, the local launcher and the doctor.

OUTPUT_DIR when set; else runs/<RUN_NAME>; else runs/<UTC timestamp> (`run_name`), read
from the clock once: `mgpu train` fills the folder into its settings when it starts
(`training.run.rundir.decide_output_dir`), and the launcher passes its workers the name it
took, so every part of a run agrees when a second passes. `mgpu bench` writes beside
training's runs, its folder's name prefixed with `bench-`.
"""

from __future__ import annotations

import time
from pathlib import Path

from mgpu_env.config.settings import Settings
from mgpu_env.hardware.folders import RUNS_ROOT
from mgpu_env.runtime.keras import Command

BENCH_PREFIX = "bench-"


def run_name(now: float | None = None) -> str:
    """A new run's name when RUN_NAME is empty: the UTC time (20261203-021500)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))


def default_output_dir(name: str, now: float | None = None) -> Path:
    """runs/<RUN_NAME>, or runs/<UTC timestamp> when RUN_NAME is empty."""
    return RUNS_ROOT / (name or run_name(now))


def run_folder(settings: Settings, command: Command = "train") -> Path:
    """The folder `command` writes: OUTPUT_DIR, else `default_output_dir` (for `mgpu bench`
    runs/bench-<RUN_NAME or UTC timestamp>)."""
    if settings.output_dir is not None:
        return settings.output_dir
    folder = default_output_dir(settings.run_name)
    return folder.with_name(BENCH_PREFIX + folder.name) if command == "bench" else folder
