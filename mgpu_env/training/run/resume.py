"""A resumed run takes its settings from its own folder.

So `OUTPUT_DIR=<folder> mgpu train` (the command an interrupted run prints) resumes it as it
was started.

The folder's record (settings.json, written when a run starts, and run.json's identity)
stands in for the defaults: a flag, the environment or the settings file still wins, so
`EPOCHS=300 OUTPUT_DIR=runs/x mgpu train` trains the same run longer. Nothing here imports
TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mgpu_env.config.errors import ConfigError
from mgpu_env.config.resolve import ResolvedSettings, resolve_settings
from mgpu_env.config.settings import BY_ENV, DECLARATIONS, with_role
from mgpu_env.training.run import rundir

# What defines a run and how it trains: a resume without them would be refused (the
# identity differs) or would train another run (EPOCHS). Where the output goes, how much
# is printed and the cluster belong to this start, not to the run.
RESUMED_SETTINGS = with_role("resumed")
# run.json's identity, for a run stopped before it wrote settings.json: its keys back to
# the settings. The precision is left out: the identity holds the policy MIXED_PRECISION
# chose (mixed_float16), which is not a value of the setting.
_FROM_IDENTITY = {
    d.identity: d.env for d in DECLARATIONS
    if "identity" in d.roles and d.env != "MIXED_PRECISION"
}


def recorded_settings(output_dir: Path) -> dict[str, str]:
    """The settings the run in `output_dir` was started with, as text keyed by env name;
    empty for a folder that holds no run, or whose records cannot be read."""
    record = _readable(output_dir / rundir.SETTINGS_FILE)
    found_entries = record.get("settings")
    entries: Mapping[str, Any] = found_entries if isinstance(found_entries, dict) else {}
    recorded = {
        name: str(entry["value"])
        for name, entry in entries.items()
        if name in RESUMED_SETTINGS and isinstance(entry, dict) and "value" in entry
    }
    found = _readable(output_dir / rundir.RUN_FILE).get("identity")
    identity: dict[str, Any] = found if isinstance(found, dict) else {}
    for key, name in _FROM_IDENTITY.items():
        if key not in identity:
            continue
        # The identity names the data set `auto` chose: resume on that one, whatever
        # `auto` would take on this machine today.
        if name not in recorded or (name == "DATASET" and recorded[name] == "auto"):
            recorded[name] = str(identity[key])
    # A default needs no record: the summary then names only what the run chose itself.
    return {name: text for name, text in recorded.items() if text != BY_ENV[name].default}


def _readable(path: Path) -> dict[str, Any]:
    """A record of the run folder, or nothing when it is absent or damaged: the plan's
    check of the folder (`state`) refuses a damaged one with the way out, after this."""
    try:
        return rundir.read_json(path) or {}
    except ConfigError:
        return {}


def resolve_run_settings(
    flags: Mapping[str, str | None], environ: Mapping[str, str], *, resume: bool = True
) -> ResolvedSettings:
    """A command's settings with the run folder decided: the one place that decides it
    (`rundir.decide_output_dir`), for `mgpu train`, `mgpu run` and a script's first
    `runtime()`. The usual precedence, and with `resume` (`mgpu train`), for a folder that
    holds a run, that run's recorded settings in place of the defaults."""
    resolved = resolve_settings(flags, environ)
    output_dir = rundir.run_folder(resolved.settings)  # decided here, once, for the run
    recorded = recorded_settings(output_dir) if resume and output_dir.is_dir() else {}
    if recorded:
        resolved = resolve_settings(flags, environ, recorded, output_dir)
    return rundir.decide_output_dir(resolved, output_dir)


def resolve_script_settings(
    flags: Mapping[str, str | None], environ: Mapping[str, str]
) -> ResolvedSettings:
    """`mgpu run`'s settings (a script's too): the run folder decided, no run's record read
    (a script's folder holds what the script writes, not a run of `mgpu train`)."""
    return resolve_run_settings(flags, environ, resume=False)


def resume_note(resolved: ResolvedSettings) -> str | None:
    """The start summary's line naming the settings a resumed run took from its folder."""
    taken = resolved.from_run_folder()
    if not taken:
        return None
    values = resolved.settings.as_text()
    listed = ", ".join(f"{name}={values[name] or '(empty)'}" for name in taken)
    return (
        f"resuming with the run folder's recorded settings: {listed} "
        "(a flag or the environment overrides them)"
    )
