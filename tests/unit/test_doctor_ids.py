"""Check ids declared once: each is a `CheckId` constant of one module, which its `@check`
names and whose calls make its results, so no return retypes (or mistypes) an id."""

from __future__ import annotations

import ast
import collections
import importlib

from mgpu_env.doctor.checks.common import REGISTRY, Check, CheckId
from mgpu_env.doctor.checks.judge import ALL_CHECKS
from tests.support.children import REPO

DOCTOR = REPO / "mgpu_env" / "doctor"
# The only `Check(...)` calls: the one CheckId makes, and the judge's line for a check that
# raised (named by its function, as before).
MAKERS = {("checks/common.py", "__call__"), ("checks/judge.py", "run_checks")}


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(DOCTOR)): ast.parse(p.read_text()) for p in DOCTOR.rglob("*.py")}


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name) and n.func.id == name]


def test_each_check_id_is_declared_once() -> None:
    declared = collections.Counter(
        call.args[0].value for tree in _modules().values() for call in _calls(tree, "CheckId")
        if call.args and isinstance(call.args[0], ast.Constant))
    twice = [value for value, count in declared.items() if count > 1]
    assert not twice, f"check ids declared more than once: {twice}"
    assert len(declared) >= len(REGISTRY), declared


def test_no_result_retypes_its_id() -> None:
    retyped = []
    for name, tree in _modules().items():
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef) and (name, function.name) not in MAKERS:
                retyped += [f"{name}:{c.lineno}" for c in _calls(function, "Check")]
    assert not retyped, f"Check(...) made with a typed id (use the module's CheckId): {retyped}"


def test_every_registered_check_names_its_modules_id() -> None:
    assert len(ALL_CHECKS) == len(REGISTRY)
    for name, registered in REGISTRY.items():
        module = importlib.import_module(registered.function.__module__)
        constants = [v for v in vars(module).values() if isinstance(v, CheckId)]
        assert registered.id in constants, f"{name}'s id {registered.id} is not its module's"


def test_a_check_id_makes_the_check_it_always_made() -> None:
    made = CheckId("host.p2p")("P2P path", "warn", "IOMMU on", "no IOMMU", "fix it",
                               skipped_for=None)
    assert made == Check("host.p2p", "P2P path", "warn", "IOMMU on", "no IOMMU", "fix it")
    assert CheckId("gpu.health").child(3)("t", "ok", "f").id == "gpu.health.3"
