"""What the code says it has, it has: every function is used outside the tests, every reference
to the library in a comment or docstring points at something that exists.

A function only tests call is code kept alive for its test, and a reader takes it for a path
the program takes. A comment that names a module, class or function that moved or went
sends the reader to look for it. Both are found by name, from the source alone.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import Counter
from pathlib import Path

from tests.support.children import REPO

LIBRARY = ("mgpu_env", "entrypoint")
# What uses the library besides itself: its benchmarks, examples and scripts (the tests do
# not count), and the docs, where a function offered to your own script is named.
USERS = ("benchmarks", "examples", "scripts", "docker")
FUNCTOOLS = frozenset({"staticmethod", "classmethod", "contextmanager", "cache", "lru_cache",
                       "wraps", "override", "abstractmethod"})
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A reference: `name`, `a.b.c` or `a.b(...)` between backticks.
REFERENCE = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?:\([^`]*\))?`")

# Functions (`path:qualified name`) in modules being restructured that only tests call, or
# nothing: they go or get their caller with that work.
BEING_RESTRUCTURED = "being restructured"
UNREACHED_WAITS: dict[str, str] = {
    "mgpu_env/training/input/feed.py:epoch_steps": BEING_RESTRUCTURED,
    "mgpu_env/training/input/keep.py:KeepLimit.keeps_rows": BEING_RESTRUCTURED,
}
# References (`path: reference`) in modules being restructured that point at what is gone.
# Empty: none the rule below sees.
DANGLING_WAITS: dict[str, str] = {}


def python_files(*places: str) -> list[Path]:
    return sorted(path for place in places for path in (REPO / place).rglob("*.py"))


def uses(tree: ast.AST) -> Counter[str]:
    """Every name a module reads (`name`, `x.name`, and `module:name` or `a.name` inside a
    string, as `python -m` and hook settings name functions), a function's use of its own name
    inside its own body left out."""
    found: Counter[str] = Counter()

    def visit(node: ast.AST, inside: tuple[str, ...]) -> None:
        if isinstance(node, ast.Name) and node.id not in inside:
            found[node.id] += 1
        elif isinstance(node, ast.Attribute) and node.attr not in inside:
            found[node.attr] += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(re.findall(r"[:.]([A-Za-z_][A-Za-z0-9_]*)\b", node.value))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inside = (*inside, node.name)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, ())
    return found


def defined_functions_of(tree: ast.AST) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """The module's functions and methods a caller of ours must name to run: not dunders, not
    those a decorator registers (`@check`, `@app.command`, `@property`), not the methods of a
    class built on another's (the base, often TensorFlow's, Keras' or `ast`'s, calls them)."""
    found = []

    def visit(node: ast.AST, prefix: str, hooks: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", bool(child.bases))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                decorators = {NAME.findall(ast.unparse(d))[-1 if "(" not in ast.unparse(d) else 0]
                              for d in child.decorator_list}
                if not (child.name.startswith("__") and child.name.endswith("__")) and not hooks \
                        and decorators <= FUNCTOOLS:
                    found.append((f"{prefix}{child.name}", child))

    visit(tree, "", False)
    return found


def unreached(library: list[Path], users: list[Path], tests: list[Path],
              documented: str) -> list[str]:
    """`path:line qualified name (who calls it)` for each function of `library` that neither
    the library, its users nor the docs name."""
    outside: Counter[str] = Counter()
    for path in [*library, *users]:
        outside.update(uses(ast.parse(path.read_text(), str(path))))
    outside.update(NAME.findall(documented))
    inside_tests: Counter[str] = Counter()
    for path in tests:
        inside_tests.update(uses(ast.parse(path.read_text(), str(path))))
    found = []
    for path in library:
        name = path.relative_to(REPO).as_posix()
        for qualified, function in defined_functions_of(ast.parse(path.read_text(), name)):
            if outside[function.name] or f"{name}:{qualified}" in UNREACHED_WAITS:
                continue
            who = "only tests call it" if inside_tests[function.name] else "nothing calls it"
            found.append(f"{name}:{function.lineno} {qualified} ({who})")
    return found


def test_every_function_has_a_caller_outside_the_tests() -> None:
    documented = "".join(path.read_text() for path in sorted((REPO / "docs").rglob("*.md")))
    found = unreached(python_files(*LIBRARY), python_files(*USERS),
                      python_files("tests"), documented)
    assert not found, (
        "Rule: every function of the library is called by the library, the CLI, a benchmark, "
        "an example or a script, or offered in the docs. A function only tests call keeps "
        "code alive for its test, and a reader takes it for a path the program takes.\n"
        "Fix: remove it (and let its tests test what the program calls), or give it its real "
        "caller. Found by name: a function whose name is used elsewhere for something else "
        "passes unseen.\n" + "\n".join(found))


def modules_of_the_library() -> dict[str, Path]:
    modules = {}
    for path in python_files(*LIBRARY):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def names_defined(tree: ast.AST) -> set[str]:
    """What a module (or a class) defines or imports, at any depth."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.id if isinstance(node, ast.Name) else node.attr)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def ours_in_scope(tree: ast.AST) -> set[str]:
    """The classes and functions a module defines or imports from the library."""
    names = {node.name for node in ast.walk(tree)
             if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    names.update(alias.asname or alias.name for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(LIBRARY)
                 for alias in node.names)
    return names


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring and node.body:
                found.append((node.body[0].lineno, docstring))
    found += [(token.start[0], token.string)
              for token in tokenize.generate_tokens(io.StringIO(source).readline)
              if token.type == tokenize.COMMENT]
    return found


def dangling(sources: dict[str, str], modules: dict[str, Path]) -> list[str]:
    """`path:line reference (why)` for each reference that names the library's code and
    points at nothing: `mgpu_env.a.b` whose module or name is gone, a module path written from
    its package (`run.rundir`, `checks.gpus.x`) whose name is gone, `Class.member` of a class
    of ours (built on no other, and imported or defined where it is named) that has no such
    member, and `file.py` that no file is."""
    defined = {module: names_defined(ast.parse(path.read_text())) for module, path in
               modules.items()}
    files = {path.name for path in REPO.rglob("*.py") if ".venv" not in path.parts}
    classes: dict[str, set[str]] = {}
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.bases:
                classes.setdefault(node.name, set()).update(names_defined(node))

    def why(reference: str, in_scope: set[str]) -> str | None:
        if reference.endswith(".py"):
            return None if reference.rsplit(".", 2)[-2] + ".py" in files else "no such file"
        parts = reference.split(".")
        ours = parts[0] in LIBRARY
        for length in range(len(parts), 1 if not ours else 0, -1):
            head = ".".join(parts[:length])
            matches = [m for m in modules if m == head or (not ours and m.endswith(f".{head}"))]
            if matches:
                rest = parts[length:]
                if not rest or any(rest[0] in defined[m] for m in matches):
                    return None
                return f"{matches[0]} has no {rest[0]}"
        if ours:
            return "no such module"
        if parts[0] in classes and parts[0] in in_scope and len(parts) > 1 \
                and parts[1] not in classes[parts[0]]:
            return f"class {parts[0]} has no {parts[1]}"
        return None

    found = []
    for name, source in sources.items():
        in_scope = ours_in_scope(ast.parse(source))
        for line, text in comments_and_docstrings(source):
            for match in REFERENCE.finditer(text.replace("`.py", ".py`")):
                reference = match.group(1)
                if f"{name}: {reference}" in DANGLING_WAITS:
                    continue
                problem = why(reference, in_scope)
                if problem is not None:
                    found.append(f"{name}:{line} `{reference}` ({problem})")
    return found


def test_no_comment_points_at_code_that_is_gone() -> None:
    # The library, what uses it and the tests; not the copies of others' scripts the tests
    # run (tests/keras2_scripts, tests/tutorials), nor this file's examples of what it finds.
    copies = (REPO / "tests" / "keras2_scripts", REPO / "tests" / "tutorials")
    sources = {path.relative_to(REPO).as_posix(): path.read_text()
               for path in python_files(*LIBRARY, *USERS, "tests")
               if not path.is_relative_to(copies[0]) and not path.is_relative_to(copies[1])
               and path != Path(__file__)}
    found = dangling(sources, modules_of_the_library())
    assert not found, (
        "Rule: a comment or docstring (of the library, its benchmarks, examples, scripts or "
        "tests) that names the library's code (`mgpu_env.x.y`, "
        "`package.module.name`, `Class.member`, `file.py`) names something that exists. One "
        "that points at code that moved or went sends the reader looking for it.\n"
        "Fix: name where it is now, or say it without the name if it is gone.\n"
        + "\n".join(found))


def test_the_reference_check_sees_what_moved_and_passes_what_is_not_ours() -> None:
    source = ('"""See `mgpu_env.config.settings.gone`, `settings.Settings` and `parsers.py`."""\n'
              "# `config.parsers.parse_gone`, `mgpu_env.nowhere`, `Declaration.gone`, `gone.py`\n"
              "# and, not ours: `model.fit`, `strategy.run`, `tf.distribute.MirroredStrategy`\n"
              "# nor `Trainer.metrics`, Keras' own (ours is not imported here)\n"
              "from mgpu_env.config.declaration import Declaration\n")
    found = dangling({"m.py": source}, modules_of_the_library())
    assert found == [
        "m.py:1 `mgpu_env.config.settings.gone` (mgpu_env.config.settings has no gone)",
        "m.py:2 `config.parsers.parse_gone` (mgpu_env.config.parsers has no parse_gone)",
        "m.py:2 `mgpu_env.nowhere` (mgpu_env has no nowhere)",
        "m.py:2 `Declaration.gone` (class Declaration has no gone)",
        "m.py:2 `gone.py` (no such file)",
    ]


def test_the_reach_check_tells_only_tests_from_nothing() -> None:
    tree = ast.parse("def used(): ...\n"
                     "def tested(): ...\n"
                     "def dead(): dead()\n"
                     "def hook(): ...\n"
                     "@check('x')\n"
                     "def registered(): ...\n"
                     "class Visitor(ast.NodeVisitor):\n"
                     "    def visit_Name(self, node): ...\n"
                     "x = used()\n")
    named = [name for name, _ in defined_functions_of(tree)]
    assert named == ["used", "tested", "dead", "hook"]
    outside = uses(tree) + Counter(NAME.findall("the docs offer `hook()`"))
    assert [n for n in named if not outside[n]] == ["tested", "dead"]
