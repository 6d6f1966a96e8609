"""The doctor's diagnosis as data.

The judged checks, the facts behind them, the one-line verdict, and the JSON object `mgpu
doctor --json` prints (its layout: SCHEMA_VERSION)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgpu_env import __version__
from mgpu_env.config.settings import GpuRequest
from mgpu_env.doctor.checks import Check, SkippedGroup, group_skipped
from mgpu_env.doctor.facts import Facts
from mgpu_env.doctor.smoke import SmokeResult
from mgpu_env.hardware import compat

# The layout of `mgpu doctor --json`; raised when a key is removed or changes meaning.
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Diagnosis:
    """The judged checks and the raw facts behind them."""

    checks: tuple[Check, ...]
    facts: Facts
    smoke: SmokeResult | None = None  # None: not asked for (--smoke)
    # What training decides here, part by part, and why a part failed (`Decisions.decided`):
    # the same object `mgpu train --dry-run --json` and `mgpu bench --dry-run --json` state.
    decisions: dict[str, Any] | None = None

    @property
    def errors(self) -> list[Check]:
        return [c for c in self.checks if c.status == "error"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warn"]

    @property
    def bad_settings(self) -> list[Check]:
        return [c for c in self.checks if c.bad_setting]

    def failing(self, strict: bool = False) -> list[Check]:
        """The errors, and with `strict` the warnings too."""
        return [c for c in self.checks if c.status == "error" or (strict and c.status == "warn")]

    def rows(self, verbose: bool = False) -> list[Check | SkippedGroup]:
        """The checks as the table shows them: with `verbose` each one, else the checks
        skipped for one shared reason (no GPU, --no-tf) folded into one row per reason."""
        return list(self.checks) if verbose else group_skipped(self.checks)

    @property
    def smoke_failed(self) -> bool:
        return self.smoke is not None and not self.smoke.ok

    def verdict(self, strict: bool = False) -> str:
        """One line before the details: `ready: 2 GPUs, TF 2.21.0, CUDA 12.5` or
        `not ready: 1 error`."""
        errors, warnings = len(self.errors), len(self.warnings)
        if errors or (strict and warnings) or self.smoke_failed:
            counted = [_count(errors, "error")] if errors else []
            if strict and warnings:
                counted.append(_count(warnings, "warning") + " (--strict)")
            if self.smoke_failed:
                counted.append("the smoke job failed")
            return "not ready: " + ", ".join(counted)
        gpus = len(self.facts.selected)
        parts = [_count(gpus, "GPU") if gpus else "CPU only"]
        tf = self.facts.tensorflow
        version = tf.version if tf is not None else self.facts.versions.get("TensorFlow")
        if version is not None and version.ok and version.value:
            parts.append(f"TF {version.value}")
        build = tf.build.value if tf is not None and tf.build.ok else None
        if gpus and build is not None and build.is_cuda_build and build.cuda_version:
            parts.append(f"CUDA {compat.minor_of(build.cuda_version)}")
        line = "ready: " + ", ".join(parts)
        return line + (f" ({_count(warnings, 'warning')})" if warnings else "")

    def to_dict(self, strict: bool = False) -> dict[str, Any]:
        """One JSON-ready object: the verdict, every check, a summary, and the raw facts."""
        return {
            "schema_version": SCHEMA_VERSION,
            "mgpu_version": __version__,
            "ready": not self.failing(strict) and not self.smoke_failed,
            "verdict": self.verdict(strict),
            "summary": {
                "errors": len(self.errors),
                "warnings": len(self.warnings),
                "bad_settings": len(self.bad_settings),
            },
            "decisions": self.decisions,
            "cluster": self.facts.cluster.cluster,
            # The Keras a script under `mgpu run` gets ({"version", "reason", "notes"}).
            "keras": _plain(self.facts.keras.run),
            "checks": [dataclasses.asdict(c) for c in self.checks],
            "facts": _plain(self.facts),
            **({"smoke": _plain(self.smoke)} if self.smoke is not None else {}),
        }


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def unusable_settings(errors: list[str]) -> dict[str, Any]:
    """`mgpu doctor --json`'s object when the settings cannot even be read (a CI parser
    still gets JSON, with the same keys): nothing was checked, and why."""
    return {
        "schema_version": SCHEMA_VERSION,
        "mgpu_version": __version__,
        "ready": False,
        "verdict": f"not ready: {_count(len(errors), 'bad setting')}",
        "summary": {"errors": len(errors), "warnings": 0, "bad_settings": len(errors)},
        "settings_errors": list(errors),
        "decisions": None,
        "cluster": None,
        "keras": None,
        "checks": [],
        "facts": None,
    }


def _plain(value: Any) -> Any:
    if isinstance(value, GpuRequest):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
