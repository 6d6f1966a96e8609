"""Every ```python block in the README and in docs/ runs, as a reader would run it: an
example that breaks fails here.

A block with a title (```python title="mymodels.py") is a file of that name. A script (a
block without a title, or one the page runs with `mgpu run NAME`) runs as `python` and as
`mgpu run`; the other files are modules, and the documented commands that use them run
as written, in bash, with `mgpu` on PATH.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.children import REPO

PAGES = ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))]
PYTHON_BLOCK = re.compile(r"^```python(?: title=\"([^\"]+)\")?\n(.*?)^```$", re.M | re.S)
SHELL_BLOCK = re.compile(r"^\s*```sh\n(.*?)^\s*```$", re.M | re.S)
# Documented commands run as written (the page's files beside them); the environment
# keeps them short: one epoch, the CPU, no downloads.
COMMANDS = [
    ("README.md", "GPUS=none VIRTUAL_DEVICES=2 RUN_NAME=mine mgpu run train.py"),
    ("docs/your-code.md", "MODEL=mymodels:cnn DATASET=mydata:load mgpu train"),
]


@dataclass(frozen=True)
class Example:
    page: str
    title: str | None
    code: str

    @property
    def is_script(self) -> bool:
        return self.title is None or f"mgpu run {self.title}" in (REPO / self.page).read_text()


def examples() -> list[Example]:
    return [Example(page, title or None, code) for page in PAGES
            for title, code in PYTHON_BLOCK.findall((REPO / page).read_text())]


def scripts() -> list[Example]:
    return [e for e in examples() if e.is_script]


def shell_lines(page: str) -> list[str]:
    blocks = SHELL_BLOCK.findall((REPO / page).read_text())
    return [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "MGPU_DEBUG", "WORKER_HOSTS", "WORKER_INDEX")}
    env.update(PYTHONPATH=str(REPO), GPUS="none", VIRTUAL_DEVICES="2",
               TF_CPP_MIN_LOG_LEVEL="2", HOME=str(tmp_path / "home"))
    return env


def test_the_docs_have_python_examples_and_each_is_complete() -> None:
    found = examples()
    assert any(e.page == "README.md" and e.is_script for e in found), (
        "the README's own-script example is a ```python block")
    for example in found:
        compile(example.code, example.page, "exec")  # a syntax error fails fast
        assert "\n...\n" not in example.code, f"{example.page}: complete it, no `...`"


def test_the_documented_commands_are_on_their_pages() -> None:
    for page, command in COMMANDS:
        assert command in shell_lines(page), f"{page} no longer shows `{command}`"
        used = set(re.findall(r"=(\w+):\w+", command))
        titles = {e.title for e in examples() if e.page == page}
        assert {f"{module}.py" for module in used} <= titles, f"{page}: show {used}"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["python", "mgpu run"])
@pytest.mark.parametrize("index", range(len(scripts())),
                         ids=[f"{e.page}:{e.title or i}" for i, e in enumerate(scripts())])
def test_each_python_script_runs(tmp_path: Path, index: int, how: str) -> None:
    example = scripts()[index]
    script = tmp_path / (example.title or "example.py")
    script.write_text(example.code)
    env = {**clean_env(tmp_path), "RUN_NAME": "readme"}
    command = [sys.executable, str(script)] if how == "python" else [
        sys.executable, "-m", "entrypoint", "run", str(script)]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    if "run_dir()" in example.code:
        assert any((tmp_path / "runs" / "readme").iterdir())


@pytest.mark.slow
@pytest.mark.parametrize(("page", "command"), COMMANDS)
def test_each_documented_command_runs_as_written(tmp_path: Path, page: str,
                                                 command: str) -> None:
    for example in examples():
        if example.page == page and example.title:
            (tmp_path / example.title).write_text(example.code)
    env = clean_env(tmp_path)
    env.update(EPOCHS="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert list((tmp_path / "runs").iterdir()), "the run folder"
