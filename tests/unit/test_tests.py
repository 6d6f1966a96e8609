"""The tests themselves: each one checks something.

A test that only calls the code proves that nothing raises, which its name rarely promises.
So every test function asserts, expects an outcome (`pytest.raises`, `pytest.warns`,
`pytest.fail`, an `assert_*` call such as numpy's `assert_allclose` or a mock's
`assert_called_once_with`), or calls by name a helper of tests/ that does, at any depth.

And each test file lives in the folder of what its tests need (tests/support/layout.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.children import REPO
from tests.support.layout import misplaced

TESTS = REPO / "tests"
CHECKING_CALLS = frozenset({"raises", "warns", "fail", "deprecated_call"})

# Helpers of tests/ that check by design without any of the above (a `check=True` run, say),
# each with the reason; a test that calls one checks something. Empty today: every helper
# that checks asserts.
CHECKING_HELPERS: dict[str, str] = {}


def _called_name(call: ast.Call) -> str | None:
    function = call.func
    if isinstance(function, ast.Attribute):
        return function.attr
    return function.id if isinstance(function, ast.Name) else None


def checks_itself(function: ast.AST) -> bool:
    """Whether the body holds an assert, a `pytest.raises`/`warns`/`fail` or an `assert_*`
    call."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = _called_name(node)
            if name is not None and (name in CHECKING_CALLS or name.startswith("assert")):
                return True
    return False


def helpers_called(function: ast.AST) -> set[str]:
    """The functions the body calls by their bare name (`helper(...)`)."""
    return {node.func.id for node in ast.walk(function)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}


def checking_helpers(modules: dict[str, ast.Module]) -> set[str]:
    """The module-level functions of tests/ that check, themselves or through another."""
    helpers: dict[str, list[ast.AST]] = {}
    for tree in modules.values():
        for statement in tree.body:
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                helpers.setdefault(statement.name, []).append(statement)
    checking = {name for name, defs in helpers.items() if any(map(checks_itself, defs))}
    checking |= set(CHECKING_HELPERS)
    grew = True
    while grew:  # a helper that calls a checking helper checks too
        more = {name for name, defs in helpers.items() if name not in checking
                and any(helpers_called(d) & checking for d in defs)}
        checking |= more
        grew = bool(more)
    return checking


def unchecked_tests(modules: dict[str, ast.Module]) -> list[str]:
    """`path:line name` of each test function (`test*`, in `test_*.py`) that checks nothing,
    itself or through the helpers of tests/ it calls by name."""
    checking = checking_helpers(modules)
    return [
        f"{path}:{node.lineno} {node.name}"
        for path, tree in sorted(modules.items()) if Path(path).name.startswith("test_")
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test")
        and not checks_itself(node) and not helpers_called(node) & checking
    ]


def test_every_test_checks_something() -> None:
    modules = {str(path.relative_to(TESTS.parent)): ast.parse(path.read_text(), str(path))
               for path in sorted(TESTS.rglob("*.py"))}
    unchecked = unchecked_tests(modules)
    assert not unchecked, ("these tests check nothing (give each the assertion its name "
                           "promises):\n" + "\n".join(unchecked))


def test_the_check_sees_a_test_that_only_calls_and_one_that_asserts_through_a_helper() -> None:
    source = (
        "def expect_sum(a, b):\n    assert a + b == 3\n"
        "def check_sum(a, b):\n    expect_sum(a, b)\n"
        "def test_calls_only():\n    sum([1, 2])\n"
        "def test_through_two_helpers():\n    check_sum(1, 2)\n"
        "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n"
        "def test_numpy():\n    np.testing.assert_allclose(1.0, 1.0)\n"
        "def test_a_helper_that_checks_nothing():\n    sum([1, 2])\n    len([])\n"
    )
    assert unchecked_tests({"tests/test_x.py": ast.parse(source)}) == [
        "tests/test_x.py:5 test_calls_only",
        "tests/test_x.py:14 test_a_helper_that_checks_nothing",
    ]


def test_each_test_file_is_in_the_folder_of_what_it_needs() -> None:
    wrong = misplaced(TESTS)
    assert not wrong, "move these with `git mv` (tests/conftest.py's fixtures apply below " \
                      "it):\n" + "\n".join(wrong)


def test_the_folder_check_sees_misplaced_files(tmp_path: Path) -> None:
    files = {
        "test_at_the_root.py": "def test_x():\n    assert True\n",
        "unit/test_builds_the_image.py": "@pytest.mark.docker\ndef test_x():\n    assert 1\n",
        "unit/test_splits_the_cpu.py": "def test_x(logical_cpus):\n    assert logical_cpus\n",
        "unit/test_runs_a_child.py": "CHILD = 'import tensorflow'\n"
                                     "def test_x():\n    assert CHILD\n",
        "processes/test_trains.py": "pytestmark = [pytest.mark.slow]\n",
        "support/test_helper_named_like_a_test.py": "import keras\n",
        "gpu/test_on_a_gpu.py": "@pytest.mark.gpu\n@pytest.mark.slow\ndef test_x():\n    "
                                "assert 1\n",
    }
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    (tmp_path / "unit" / "__init__.py").write_text("")
    (tmp_path / "processes" / "__init__.py").write_text("")
    assert [line.split(" (")[0] for line in misplaced(tmp_path)] == [
        "tests/gpu/: no __init__.py",
        "tests/support/test_helper_named_like_a_test.py: belongs in tests/tensorflow_inprocess/",
        "tests/test_at_the_root.py: belongs in tests/unit/",
        "tests/unit/test_builds_the_image.py: belongs in tests/docker/",
        "tests/unit/test_splits_the_cpu.py: belongs in tests/tensorflow_inprocess/",
    ]
