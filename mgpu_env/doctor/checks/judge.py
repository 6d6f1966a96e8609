"""The checks in report order, and the judge that turns each into `Check`s.

Every topic module of this package is imported here, which registers its `@check`
functions (`common.REGISTRY`); the report order and the pre-flight's subset come from
their registrations, so a new check, or a new topic module, needs no edit here.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from pathlib import Path

from mgpu_env.doctor.checks.common import REGISTRY, Check, CheckFunction
from mgpu_env.doctor.facts import Facts

_NOT_TOPICS = {"common", "judge"}
for _module in pkgutil.iter_modules([str(Path(__file__).parent)]):
    if _module.name not in _NOT_TOPICS:
        importlib.import_module(f"{__package__}.{_module.name}")


def registered(*, preflight: bool = False) -> tuple[CheckFunction, ...]:
    """The registered checks in report order; with `preflight`, only the pre-flight's."""
    chosen = sorted((r for r in REGISTRY.values() if r.preflight or not preflight),
                    key=lambda r: r.order)
    return tuple(r.function for r in chosen)


ALL_CHECKS: tuple[CheckFunction, ...] = registered()
PREFLIGHT_CHECKS: tuple[CheckFunction, ...] = registered(preflight=True)


def run_checks(
    facts: Facts, checks: Iterable[CheckFunction] | None = None
) -> list[Check]:
    """Every check (default: `ALL_CHECKS`), in report order. A check that raises becomes a
    warning, not a crash."""
    results: list[Check] = []
    for check in ALL_CHECKS if checks is None else checks:
        try:
            outcome = check(facts)
        except Exception as err:
            name = getattr(check, "__name__", "check")
            results.append(Check(name, name, "warn", f"could not collect ({err!r})"))
            continue
        results.extend(outcome if isinstance(outcome, list) else [outcome])
    return results
