"""The shapes of the code, as rules that say why: one purpose a module, the facts a function needs.

Lines were once counted instead (a module at most 450, a function at most 60 unless it said
why), and code went where the count let it: several files sat exactly at the cap. What the
count stood for is checked here instead. A module does one thing, and says which in the one
line `help()`, an editor's hover and the docs show first. A function takes the facts it needs,
and facts that travel together from caller to caller travel as one record.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.children import REPO

CHECKED = ("mgpu_env", "entrypoint")
SUMMARY_ENDS = (".", "?")

# A function takes at most this many parameters (`self` and `cls` not counted; `*args` and
# `**kwargs` count one each). Five is pylint's `max-args` and ruff's PLR0913 default: past it,
# a caller lines up values it cannot tell apart by position, and a reader holds more than the
# function's purpose in mind.
MAX_PARAMETERS = 5


# Functions (`path:qualified name`) that may take more than MAX_PARAMETERS, each with why.
PARAMETERS_ALLOWED: dict[str, str] = {
    "mgpu_env/doctor/checks/common.py:CheckId.__call__": (
        "makes one `Check` from its fields: every check's return names them, so the signature "
        "is the record's own field list"),
    "mgpu_env/config/declaration.py:setting": (
        "builds one `Declaration` from its fields: each call in settings.py names them, so the "
        "signature is the record's own field list"),
}

# Functions past MAX_PARAMETERS still to reshape: each reason says which values travel
# together, so the fix is known; the list shrinks to nothing.
PARAMETERS_TO_RESHAPE: dict[str, str] = {
    "mgpu_env/training/multiworker/backstop.py:stuck_message": (
        "who, phase, the time waited, the bound and the setting that set it are what one "
        "progress line of the backstop's helper carries: they can travel as one record"),
    "mgpu_env/training/multiworker/faults.py:Watchdog.__init__": (
        "its options past the bound and the stall callback (the report, the dump's fd, the "
        "re-arm period, the peers, the line tag) are the stall watch's alone, its one caller "
        "that sets more than two: they can travel as one record"),
}


def modules() -> list[Path]:
    return sorted(path for place in CHECKED for path in (REPO / place).rglob("*.py"))


def summary_problem(tree: ast.Module) -> str | None:
    """What is wrong with a module's first docstring line, or None when it names one purpose:
    there is a docstring, its first paragraph is one line, one sentence ending with `.` or `?`,
    and no `;` joins a second statement to it."""
    docstring = ast.get_docstring(tree, clean=True)
    if not docstring:
        return "it has no docstring"
    paragraph = docstring.split("\n\n")[0]
    if "\n" in paragraph:
        return (f"its first paragraph runs over {paragraph.count(chr(10)) + 1} lines; the "
                "summary is the first line alone")
    if not paragraph.endswith(SUMMARY_ENDS):
        return "its first line does not end a sentence (with '.' or '?')"
    if ";" in paragraph:
        return "its first line joins two statements with ';'"
    return None


def summary_failures(paths: list[Path]) -> list[str]:
    failures = []
    for path in paths:
        name = path.relative_to(REPO).as_posix()
        problem = summary_problem(ast.parse(path.read_text(), name))
        if problem is not None:
            failures.append(f"{name}: {problem}")
    return failures


def test_every_module_names_its_one_purpose_in_its_first_line() -> None:
    failures = summary_failures(modules())
    assert not failures, (
        "Rule: a module's docstring starts with one line, one sentence, that names the one "
        "thing the module is for. That line is what `help()`, an editor and the docs show "
        "first, and a purpose that does not fit in it is usually two modules.\n"
        "Fix: write that sentence, with the details in the paragraph after a blank line; if "
        "it needs an 'and' between two subjects or a ';', split the module.\n"
        + "\n".join(failures))


def is_cli_command(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A typer command: its parameters are the command's options and arguments, declared with
    `typer.Option`/`typer.Argument` (or an alias ending in `Option`), so typer reads its
    signature as the command line's list, not as a call's."""
    annotations = [arg.annotation for arg in [*function.args.args, *function.args.kwonlyargs]
                   if arg.annotation is not None]
    text = " ".join(ast.unparse(annotation) for annotation in annotations)
    return "typer.Option" in text or "typer.Argument" in text


def parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    arguments = function.args
    named = [arg.arg for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
             if arg.arg not in ("self", "cls")]
    return len(named) + (arguments.vararg is not None) + (arguments.kwarg is not None)


def functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function of a module with its qualified name (`Class.method`, `outer.inner`)."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((f"{prefix}{child.name}", child))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return found


def parameter_failures(paths: list[Path]) -> list[str]:
    failures = []
    for path in paths:
        name = path.relative_to(REPO).as_posix()
        for qualified, function in functions(ast.parse(path.read_text(), name)):
            count = parameter_count(function)
            if (count > MAX_PARAMETERS and not is_cli_command(function)
                    and f"{name}:{qualified}" not in PARAMETERS_ALLOWED
                    and f"{name}:{qualified}" not in PARAMETERS_TO_RESHAPE):
                failures.append(f"{name}:{function.lineno} {qualified} takes {count}")
    return failures


def test_a_function_takes_the_facts_it_needs_and_what_travels_together_as_a_record() -> None:
    failures = parameter_failures(modules())
    assert not failures, (
        f"Rule: a function takes at most {MAX_PARAMETERS} parameters (self and cls not "
        "counted). Past that, callers line up values they cannot tell apart by position, and "
        "the same few values are usually handed down together from function to function.\n"
        "Fix: find the parameters its callers pass together (the same values, from the same "
        "place) and make them one record (a frozen dataclass the caller already holds, or a "
        "new one); pass the record, or drop the ones the function only forwards. If the "
        "function really needs more, add it to PARAMETERS_ALLOWED with the reason.\n"
        + "\n".join(failures))



def package_code(tree: ast.Module) -> list[str]:
    """The functions and classes a package's `__init__` defines (a module-level `__getattr__`
    that loads the package's modules on first use re-exports: it is not counted)."""
    return [node.name for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.name != "__getattr__"]


def test_a_packages_init_re_exports_and_its_code_lives_in_named_modules() -> None:
    found = [f"{path.relative_to(REPO).as_posix()}: defines {', '.join(names)}"
             for path in modules() if path.name == "__init__.py"
             and (names := package_code(ast.parse(path.read_text())))]
    assert not found, (
        "Rule: a package's __init__.py names what the package offers, importing it from the "
        "modules that hold it; it defines no function or class itself. A reader looks for "
        "code in a module named for it, and `import package.module` then loads what it "
        "needs, not the package's code too.\n"
        "Fix: move the code to a module named for what it does and import it in __init__.py "
        "(listed in __all__).\n" + "\n".join(found))


def test_the_summary_rule_fails_a_module_of_two_purposes(tmp_path: Path) -> None:
    cases = {
        "none.py": "x = 1\n",
        "long.py": '"""The feed and\nthe stream."""\n',
        "two.py": '"""The feed; the stream."""\n',
        "open.py": '"""The feed, the stream, the\n\nrest."""\n',
        "good.py": '"""The streams of rows that stay on the host.\n\nDetails here; more."""\n',
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    problems = {name: summary_problem(ast.parse(text)) for name, text in cases.items()}
    assert problems["none.py"] == "it has no docstring"
    assert "2 lines" in (problems["long.py"] or "")
    assert "';'" in (problems["two.py"] or "")
    assert "does not end a sentence" in (problems["open.py"] or "")
    assert problems["good.py"] is None


def test_the_parameter_rule_counts_what_a_caller_passes_and_spares_cli_commands() -> None:
    tree = ast.parse(
        "class A:\n"
        "    def method(self, a, b, c, d, e): ...\n"
        "    def wide(self, a, b, c, *rest, key, **more): ...\n"
        "def command(a: Annotated[int, typer.Option()], b, c, d, e, f): ...\n"
        "def outer():\n"
        "    def inner(a, b, c, d, e, f): ...\n")
    found = {name: (parameter_count(f), is_cli_command(f)) for name, f in functions(tree)}
    assert package_code(tree) == ["A", "command", "outer"]
    assert found == {"A.method": (5, False), "A.wide": (6, False), "command": (6, True),
                     "outer": (0, False), "outer.inner": (6, False)}
