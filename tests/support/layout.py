"""Where a test file lives: the folder of tests/ named by what its tests need, so the tree
tells which tests a machine can run and about how long they take (tests/unit/test_tests.py
holds every test file to it)."""

from __future__ import annotations

import ast
from pathlib import Path

# The folders of tests/, each with what puts a test file there; the first that applies wins,
# so a file is in the folder of the most that any of its tests needs.
FOLDERS = {
    "docker": "a test marked `docker`: a Docker engine, the image built and run",
    "slurm": "the one-node Slurm: imports tests.support.slurm_cluster",
    "gpu": "a test marked `gpu`: a real GPU",
    "processes": "a test marked `slow`: trains real models or starts processes, seconds to "
                 "minutes",
    "tensorflow_inprocess": "TensorFlow in the test process: takes `logical_cpus`, or imports "
                            "tensorflow, keras or tf_keras",
    "unit": "none of the above: settings, parsers, the doctor on canned probes, manifests, "
            "docs; quick",
}
TENSORFLOW_PACKAGES = frozenset({"tensorflow", "keras", "tf_keras"})


def pytest_marks(tree: ast.Module) -> set[str]:
    """The names X of every `pytest.mark.X` in the module (decorators and `pytestmark`)."""
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark" and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "pytest"}


def folder_for(tree: ast.Module) -> str:
    """The folder of FOLDERS a test module belongs in. Imports inside strings (the code a
    child runs) are not the test process's: only real import statements count."""
    marks = pytest_marks(tree)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    arguments = {arg.arg for node in ast.walk(tree)
                 if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                 for arg in node.args.args}
    if "docker" in marks:
        return "docker"
    if "tests.support.slurm_cluster" in imported:
        return "slurm"
    if "gpu" in marks:
        return "gpu"
    if "slow" in marks:
        return "processes"
    if "logical_cpus" in arguments or {n.split(".")[0] for n in imported} & TENSORFLOW_PACKAGES:
        return "tensorflow_inprocess"
    return "unit"


def misplaced(tests: Path) -> list[str]:
    """`path: what is wrong` for each test file (`test_*.py`) of `tests` outside the folder
    of FOLDERS its tests need, and each folder of FOLDERS without its `__init__.py` (pytest
    names a module by its package; without one two folders could not hold the same name)."""
    wrong = [f"tests/{name}/: no __init__.py" for name in FOLDERS
             if (tests / name).is_dir() and not (tests / name / "__init__.py").is_file()]
    for path in sorted(tests.rglob("test_*.py")):
        where = path.relative_to(tests)
        needed = folder_for(ast.parse(path.read_text(), str(path)))
        if where.parts[:-1] != (needed,):
            wrong.append(f"tests/{where.as_posix()}: belongs in tests/{needed}/ "
                         f"({FOLDERS[needed]})")
    return wrong

