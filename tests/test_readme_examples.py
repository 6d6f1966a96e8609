"""Every ```python block in the README runs, as a reader would run it: a README example
that breaks fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.M | re.S)


def readme_python_examples() -> list[str]:
    return PYTHON_BLOCK.findall((REPO / "README.md").read_text())


def test_the_readme_has_python_examples_and_each_is_complete() -> None:
    examples = readme_python_examples()
    assert examples, "the README's Python API example is a ```python block"
    for code in examples:
        compile(code, "README.md", "exec")  # a syntax error fails fast, without TensorFlow
        assert "\n...\n" not in code, "an example with `...` cannot run: complete it"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["python", "mgpu run"])
@pytest.mark.parametrize("index", range(len(readme_python_examples())))
def test_each_readme_python_example_runs(tmp_path: Path, index: int, how: str) -> None:
    script = tmp_path / "example.py"
    script.write_text(readme_python_examples()[index])
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "MGPU_DEBUG")}
    env.update(PYTHONPATH=str(REPO), GPUS="none", VIRTUAL_DEVICES="2", RUN_NAME="readme",
               TF_CPP_MIN_LOG_LEVEL="2", HOME=str(tmp_path / "home"))
    command = [sys.executable, str(script)] if how == "python" else [
        sys.executable, "-m", "entrypoint", "run", str(script)]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    if "run_dir()" in readme_python_examples()[index]:
        assert any((tmp_path / "runs" / "readme").iterdir())
