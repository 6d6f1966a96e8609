"""Where each setting's value comes from, and the checks on all of them together.

`resolve_settings` applies the precedence (flag > environment > the settings file > the
run folder's record, when a run is resumed > default) to every declaration in
`settings.py`, validates each value with its parser and reports every bad one at once;
names that look like a mistyped setting become warnings, or errors under `strict_errors`
(`--strict`, `MGPU_STRICT=1`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dotenv import dotenv_values

from mgpu_env.config.settings import (
    BY_ENV,
    DECLARATIONS,
    DEFAULT_ENV_FILE,
    Declaration,
    SettingError,
    Settings,
    SettingsErrors,
)
from mgpu_env.config.text import shown


@dataclass(frozen=True)
class UnknownName:
    """A name in the settings file or the environment that is not a setting but looks like
    one: `meant` is the setting it was probably meant to be (None: no setting is close)."""

    name: str
    value: str
    where: str  # "in .env", "in the environment"
    meant: str | None


@dataclass(frozen=True)
class ResolvedSettings:
    """Settings plus where each value came from, for summaries and error messages.

    `warnings` are user-facing lines about names that look like a mistyped setting; the
    CLI prints them on stderr.
    """

    settings: Settings
    sources: dict[str, str]
    env_file: Path | None
    env_file_values: dict[str, str]
    warnings: tuple[str, ...] = ()
    unknown: tuple[UnknownName, ...] = ()
    # Settings a command filled in once from others when it started (OUTPUT_DIR from
    # RUN_NAME and the clock: `training.run.rundir.decide_output_dir`), as they were asked:
    # the run reads the filled value, the provenance shows the asked one.
    asked: Mapping[str, str] = field(default_factory=dict)

    def filled_in(self, env: str, value: Any) -> ResolvedSettings:
        """These settings with `env`'s value decided from the others; its source stays."""
        text = self.settings.as_text()[env]
        settings = dataclasses.replace(self.settings, **{BY_ENV[env].field_name: value})
        return dataclasses.replace(self, settings=settings, asked={**self.asked, env: text})

    def origin(self, env: str) -> str:
        """Where a setting's value came from, in one word: flag, env, the file, default."""
        source = self.sources.get(env, "default")
        if source.startswith("flag"):
            return "flag"
        if source == "the environment":
            return "env"
        if source.startswith("file "):
            return source.removeprefix("file ")
        if source.startswith("run folder "):
            return "run folder"
        return "default"

    def from_run_folder(self) -> list[str]:
        """The settings taken from the run folder's record (a resumed run's own)."""
        return [env for env, source in self.sources.items() if source.startswith("run folder ")]

    def provenance(self, names: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
        """Each setting's value (as text) and origin, in declaration order: what the start
        summary, `--dry-run --json`, settings.json and `mgpu doctor --report` show."""
        values = {**self.settings.as_text(), **self.asked}
        wanted = list(values) if names is None else [n for n in values if n in set(names)]
        return {name: {"value": values[name], "source": self.origin(name)} for name in wanted}


# Variables that share a setting's look but belong to someone else: never a typo.
FOREIGN_PREFIXES = (
    "NCCL_", "TF_", "CUDA_", "CUDNN_", "COMPOSE_", "HOST_", "NVIDIA_", "XLA_", "PYTHON",
    "KERAS_", "MGPU_", "LD_", "LC_", "XDG_", "SSH_", "DOCKER_", "BUILDKIT_", "PIP_", "OMP_",
    "KMP_", "MKL_", "ONEDNN_", "DNNL_", "GRPC_", "ABSL_", "CONDA_", "VIRTUAL_ENV", "GITHUB_",
    "RUNNER_", "CI_", "GITLAB_", "KUBERNETES_", "SLURM_", "PMI_", "OMPI_", "HF_", "TORCH",
    "JAX_", "TPU_", "AWS_", "GOOGLE_", "AZURE_", "NO_COLOR", "FORCE_COLOR", "TERM",
)
FOREIGN_NAMES = frozenset({
    "HOME", "USER", "SHELL", "PWD", "OLDPWD", "LANG", "LOGNAME", "HOSTNAME", "COLUMNS",
    "LINES", "SHLVL", "TMPDIR", "TZ", "EDITOR", "PAGER", "DISPLAY", "MAIL", "_",
    # docker compose's own variables in .env.example
    "SHM_SIZE", "TENSORBOARD_PORT",
})
_SETTING_LIKE = re.compile(r"^[A-Z][A-Z0-9_]*$")
TYPO_CUTOFF = 0.8


def _foreign(name: str) -> bool:
    return (
        name in FOREIGN_NAMES
        or name.startswith(FOREIGN_PREFIXES)
        or name.endswith(("PATH", "PATHS"))
    )


def likely_setting(name: str) -> str | None:
    """The declared setting `name` was probably meant to be (EPOCH -> EPOCHS), else None."""
    if name in BY_ENV or not _SETTING_LIKE.match(name) or _foreign(name):
        return None
    matches = difflib.get_close_matches(name, list(BY_ENV), n=1, cutoff=TYPO_CUTOFF)
    return matches[0] if matches else None


def unknown_names(
    file_values: Mapping[str, str], environ: Mapping[str, str], env_file: Path | None
) -> tuple[UnknownName, ...]:
    """The names mgpu ignores that a user may have meant as settings: in the settings file
    or the environment, those close to a setting (EPOCH -> EPOCHS); in the settings file
    also any other setting-like name no tool claims (`FOREIGN_*`), which only `--strict`
    judges (such a name is exported to the run, and may be meant for the script)."""
    found = []
    for names, where, all_unknown in (
        (file_values, f"in {env_file}", True), (environ, "in the environment", False)
    ):
        for name in sorted(names):
            meant = likely_setting(name)
            plain_unknown = (
                all_unknown and meant is None and name not in BY_ENV
                and _SETTING_LIKE.match(name) is not None and not _foreign(name)
            )
            if meant is not None or plain_unknown:
                found.append(UnknownName(name, names[name], where, meant))
    return tuple(found)


def typo_warnings(
    unknown: Iterable[UnknownName], in_effect: Mapping[str, str]
) -> tuple[str, ...]:
    """One line per name that looks like a mistyped setting, naming the setting it
    probably meant. mgpu ignores such a name (a file's is exported to the run like its
    other variables), so the user would otherwise never learn that EPOCH=3 trained for the
    default 5 epochs. `in_effect`: each setting's value and origin as text ("5 (default)")."""
    return tuple(
        f"{u.name} {u.where} is not a setting; did you mean {u.meant}? "
        f"({u.name}={shown(u.value)} is ignored; {u.meant} is {in_effect[u.meant]})"
        for u in unknown if u.meant is not None
    )


STRICT_FIX = "or run without --strict (MGPU_STRICT=0) to let mgpu ignore it"


def strict_errors(resolved: ResolvedSettings) -> list[str]:
    """What `--strict` (MGPU_STRICT=1) refuses: every name that looks like a mistyped
    setting, and every unknown setting-like name in the settings file, one message each,
    so a batch job or CI stops (exit 2) instead of training with a default by mistake."""
    errors = []
    for u in resolved.unknown:
        if u.meant is not None:
            fix = f"rename it to {u.meant}" + (
                f" (in {resolved.env_file})" if u.where != "in the environment" else
                f" (export {u.meant}={u.value}; unset {u.name})")
            errors.append(
                f"Unknown setting {u.name}={shown(u.value)} ({u.where}): did you mean {u.meant}? "
                f"(--strict).\n  Fix: {fix}, {STRICT_FIX}."
            )
        else:
            errors.append(
                f"Unknown setting {u.name}={shown(u.value)} ({u.where}): mgpu has no such "
                "setting (--strict).\n  Valid: the settings `mgpu train --help` lists, or "
                "another tool's variable (NCCL_*, TF_*, ...). "
                f"Fix: remove the line, export it in the environment instead, {STRICT_FIX}."
            )
    return errors


def _source_label(
    kind: str, declaration: Declaration, env_file: Path | None, record_from: Path | None = None
) -> str:
    if kind == "flag":
        return f"flag {declaration.flag}"
    if kind == "environment":
        return "the environment"
    if kind == "file":
        return f"file {env_file}"
    if kind == "record":
        return f"run folder {record_from}"
    return "default"


def setting_error_message(declaration: Declaration, text: str, source: str, reason: str) -> str:
    """Two lines: the setting, the value and where it came from, why; what is valid, the fix."""
    if source.startswith("flag"):
        where = f"pass a valid value to {declaration.flag}"
    elif source == "the environment":
        where = f"export {declaration.env}=<valid value>, or unset it"
    elif source.startswith("file"):
        where = f"edit {declaration.env} in {source.removeprefix('file ')}, or remove the line"
    elif source.startswith("run folder"):
        where = f"set {declaration.env} (the run folder's recorded value no longer works)"
    else:
        where = f"set {declaration.env}"
    return (
        f"Bad setting {declaration.env}={shown(text)} (from {source}): {reason}"
        f"{'' if reason.endswith('?') else '.'}\n"
        f"  Valid: {declaration.valid}. Fix: {where}."
    )


def _read_env_file(path: Path) -> dict[str, str]:
    try:
        return {key: value or "" for key, value in dotenv_values(path).items()}
    except (OSError, UnicodeDecodeError) as err:
        raise SettingsErrors(
            [f"The settings file {path} cannot be read ({err}).\n"
             "  Fix: make it a readable UTF-8 text file, or point ENV_FILE elsewhere."]
        ) from None


def resolve_settings(
    flags: Mapping[str, str | None],
    environ: Mapping[str, str],
    recorded: Mapping[str, str] | None = None,
    recorded_from: Path | None = None,
) -> ResolvedSettings:
    """Resolve every setting: flag > environment > env file > record > default, then validate.

    `flags` maps env-var names to the text given on the command line (None: not given).
    `recorded` holds what a resumed run's folder (`recorded_from`) says it ran with: it
    stands in for the defaults, so the folder's resume command needs no settings repeated.
    Raises SettingsErrors listing every bad value, so the user fixes them in one go.
    """
    errors: list[str] = []
    env_decl = BY_ENV["ENV_FILE"]
    env_file: Path | None = None
    env_file_text, env_file_source = _Sources(flags, environ).pick(env_decl)
    try:
        env_file = env_decl.parse(env_file_text)
    except SettingError as err:
        errors.append(setting_error_message(env_decl, env_file_text, env_file_source, str(err)))
        raise SettingsErrors(errors) from None
    if env_file is None and Path(DEFAULT_ENV_FILE).is_file():
        env_file = Path(DEFAULT_ENV_FILE)
    file_values = _read_env_file(env_file) if env_file is not None else {}

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    sources_of = _Sources(flags, environ, file_values, env_file, recorded or {}, recorded_from)
    for declaration in DECLARATIONS:
        text, source = sources_of.pick(declaration)
        sources[declaration.env] = source
        try:
            values[declaration.field_name] = declaration.parse(text)
        except SettingError as err:
            errors.append(setting_error_message(declaration, text, source, str(err)))
    if errors:
        raise SettingsErrors(errors)
    values["env_file"] = env_file
    settings = Settings(**values)
    in_effect = {
        name: f"{value or '(empty)'} ({sources[name]})"
        for name, value in settings.as_text().items()
    }
    unknown = unknown_names(file_values, environ, env_file)
    warnings = typo_warnings(unknown, in_effect)
    return ResolvedSettings(settings, sources, env_file, file_values, warnings, unknown)


@dataclass(frozen=True)
class _Sources:
    """Where a setting's text can come from, highest precedence first: the flags, the
    process environment, the settings file (its values; its path names the source), a
    resumed run's record (its values; its folder names the source), the default."""

    flags: Mapping[str, str | None]
    environ: Mapping[str, str]
    file_values: Mapping[str, str] = field(default_factory=dict)
    env_file: Path | None = None
    recorded: Mapping[str, str] = field(default_factory=dict)
    recorded_from: Path | None = None

    def pick(self, declaration: Declaration) -> tuple[str, str]:
        """The setting's text and its source's label, from the first source that has it."""
        name, env_file = declaration.env, self.env_file
        flag_value = self.flags.get(name)
        if flag_value is not None:
            return flag_value, _source_label("flag", declaration, env_file)
        if name in self.environ:
            return self.environ[name], _source_label("environment", declaration, env_file)
        if name in self.file_values:
            return self.file_values[name], _source_label("file", declaration, env_file)
        if name in self.recorded:
            return self.recorded[name], _source_label(
                "record", declaration, env_file, self.recorded_from
            )
        return declaration.default, "default"
