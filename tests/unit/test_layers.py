"""The layers the folders promise, checked on the imports themselves (lazy ones included).

config, hardware, profile, estimate  <  runtime (the decisions, the cluster among them)  <
training, doctor, bench  <  launcher, api, entrypoint. The doctor and training never import
each other (the commands run the pre-flight), and the runtime imports nothing of training.
Inside training, its folders import one way too: shared < step < input < run (multiworker
under run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.children import REPO

PACKAGE = REPO / "mgpu_env"

# Folder (or module) -> what none of its modules may import, at any depth of the code.
FORBIDDEN = {
    "config": ("mgpu_env.hardware", "mgpu_env.runtime", "mgpu_env.training", "mgpu_env.doctor",
               "mgpu_env.bench", "mgpu_env.launcher", "entrypoint"),
    "hardware": ("mgpu_env.runtime", "mgpu_env.training", "mgpu_env.doctor", "mgpu_env.bench",
                 "mgpu_env.launcher", "entrypoint", "mgpu_env.tfprobes"),
    "tfprobes": ("mgpu_env.runtime", "mgpu_env.training", "mgpu_env.doctor", "mgpu_env.bench",
                 "mgpu_env.launcher", "entrypoint"),
    "runtime": ("mgpu_env.training", "mgpu_env.doctor", "mgpu_env.bench", "mgpu_env.launcher",
                "entrypoint"),
    "training": ("mgpu_env.doctor", "mgpu_env.bench", "mgpu_env.launcher", "entrypoint"),
    "doctor": ("mgpu_env.training", "mgpu_env.bench", "mgpu_env.launcher", "entrypoint"),
    # The profiler's split and the estimates serve training and bench alike: below both.
    "profile": ("mgpu_env.runtime", "mgpu_env.training", "mgpu_env.doctor", "mgpu_env.bench",
                "mgpu_env.launcher", "entrypoint"),
    "estimate": ("mgpu_env.runtime", "mgpu_env.training", "mgpu_env.doctor", "mgpu_env.bench",
                 "mgpu_env.launcher", "entrypoint"),
    # `mgpu run`'s launcher, its source scan and strategy watch: below the commands only.
    "launcher": ("entrypoint",),
    # A supervised run's recovery reads the doctor's health and the run's folder: above both.
    "recovery": ("mgpu_env.launcher", "entrypoint"),
}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, wherever the import statement is."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def modules_of(layer: str) -> list[Path]:
    folder = PACKAGE / layer
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [PACKAGE / f"{layer}.py"]


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer: str) -> None:
    crossings = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in modules_of(layer)
        for name in sorted(imported_modules(path))
        if name.startswith(FORBIDDEN[layer])
    ]
    assert not crossings, "\n".join(crossings)


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from mgpu_env.training import plan\n")
    assert "mgpu_env.training.plan" in imported_modules(module)


# training/'s folders, one way: shared < step < input < run (multiworker beside input, under
# run). The step knows nothing of where its batches come from; the input runs the steps it is
# given (its feeds call `step.loops`) and calls the user's loader through `step.user_code`'s
# import; the run plans, prepares and trains with all of them. `shared` holds what the
# folders share (message pieces, atomic writes, the tutorial data's shape), below them all.
TRAINING = "mgpu_env.training"
TRAINING_FORBIDDEN = {
    "shared": ("step", "input", "multiworker", "run"),
    "step": ("input", "multiworker", "run"),
    "input": ("multiworker", "run"),
    "multiworker": ("input", "run"),
}


@pytest.mark.parametrize("folder", sorted(TRAINING_FORBIDDEN))
def test_trainings_folders_import_one_way(folder: str) -> None:
    above = tuple(f"{TRAINING}.{name}" for name in TRAINING_FORBIDDEN[folder])
    paths = sorted((PACKAGE / "training" / folder).rglob("*.py"))
    assert paths, f"training/{folder} has no modules"
    crossings = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in paths
        for name in sorted(imported_modules(path))
        if name in above or name.startswith(tuple(f"{a}." for a in above))
    ]
    assert not crossings, "\n".join(crossings)


def test_the_folder_check_would_see_input_importing_run(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from mgpu_env.training.run import rundir\n"
                      "from mgpu_env.training.runtime_like import x\n")
    above = tuple(f"{TRAINING}.{name}" for name in TRAINING_FORBIDDEN["input"])
    found = [name for name in sorted(imported_modules(module))
             if name in above or name.startswith(tuple(f"{a}." for a in above))]
    assert found == ["mgpu_env.training.run", "mgpu_env.training.run.rundir"]


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in tests/support; a test module (or conftest) imported by another
    would run its tests twice and tie the two together."""
    tests = REPO / "tests"
    crossings = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in sorted(tests.rglob("*.py"))
        for name in sorted(imported_modules(path))
        if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith(("test_", "conftest"))
    ]
    assert not crossings, "\n".join(crossings)


def module_graph() -> dict[str, set[str]]:
    """Each module of mgpu_env and entrypoint -> the modules of the two it imports, at any
    depth of the code (a package's `__init__` is a module of its own, as import-linter
    counts it)."""
    files = {}
    for path in [*sorted(PACKAGE.rglob("*.py")), *sorted((REPO / "entrypoint").rglob("*.py"))]:
        parts = path.relative_to(REPO).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {
        module: {name for name in imported_modules(path) if name in files and name != module}
        for module, path in files.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a loop."""
    reach = {module: set(targets) for module, targets in graph.items()}
    changed = True
    while changed:  # the transitive closure: small graphs, a few passes
        changed = False
        for targets in reach.values():
            more = set().union(*(reach[t] for t in targets)) - targets
            if more:
                targets |= more
                changed = True
    groups = {frozenset({m, *(t for t in reach[m] if m in reach[t])})
              for m in graph if m in reach[m]}
    return sorted(sorted(group) for group in groups)


def test_no_import_cycles_function_level_imports_included() -> None:
    cycles = import_cycles(module_graph())
    assert not cycles, "\n".join(" <-> ".join(group) for group in cycles)


def test_the_cycle_check_sees_a_loop_through_a_lazy_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
