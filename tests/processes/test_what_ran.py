"""What `mgpu run` says ran, held against scripts whose runs are known (tests/run_scripts/),
each under `mgpu run` on 2 logical CPUs, tiny data, one epoch: the strategy stepped (not
the last built), devices named that do not exist, a DTensor mesh on devices of the script's
own with no Keras layer, Keras 3's clear_session resetting the policy, and a script that
fails at import. `.venv/bin/python -m tests.run_scripts.measure` prints every case."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.run_scripts.measure import CASES, Case, judge, run
from tests.support.children import REPO

pytestmark = pytest.mark.slow

CHOSEN = {"first_of_four.py", "named_gpus.py", "dtensor_mesh.py", "keras3_clear_session.py",
          "fails_at_import.py"}


def mgpu_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mgpu run")]


@pytest.mark.parametrize("case", [c for c in CASES if c.script in CHOSEN],
                         ids=lambda c: c.script)
def test_what_mgpu_says_ran_is_what_ran(tmp_path: Path, case: Case) -> None:
    result = run(case, tmp_path, REPO)
    assert judge(case, result.stderr) == "true", result.stderr[-3000:]
    said = mgpu_lines(result.stderr)
    assert ": planned 2 x logical CPU, 2 replica(s)" in said[0], said
    if case.script == "fails_at_import.py":
        # Only the start summary, and the script's own error last.
        assert result.returncode == 1 and len(said) == 1, said
        assert result.stderr.strip().splitlines()[-1].startswith("ModuleNotFoundError")
    elif case.script == "first_of_four.py":
        # Said before its first step too: built, then the first step's, which agrees.
        assert result.returncode == 0 and not any("warning" in line for line in said), said
    elif case.script == "named_gpus.py":
        warned = [line for line in said if line.startswith("mgpu run: warning: strategy.run")]
        assert warned and "names GPU:0, GPU:1, which TensorFlow does not list" in warned[0]
    elif case.script == "dtensor_mesh.py":
        assert any(line.startswith("mgpu run: mesh that ran: DTensor mesh batch=8 on 8 "
                                   "devices") for line in said), said
        assert said[-1].startswith("mgpu run: warning: precision that ran: no Keras layer "
                                   "computed"), said
    else:
        assert said[-1].startswith("mgpu run: warning: clear_session() at "), said
