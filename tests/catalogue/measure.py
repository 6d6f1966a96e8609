"""`python -m tests.catalogue.measure`: run every catalogue thread against this checkout's
doctor and count how many it detects, names the cause of and prints the fix for.

Each thread runs in a fresh temporary folder (also the working folder, so no .env is read).
Works on older checkouts too: copy tests/catalogue, tests/support/fakecuda.py,
tests/support/fake_nvml.py and tests/fixtures/{fakecuda,standin_tensorflow} into one and run
it there.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from tests.catalogue.harness import Outcome, simulate
from tests.catalogue.threads import THREADS


def run_all(verbose: bool = False) -> list[Outcome]:
    outcomes = []
    start = os.getcwd()
    for thread in THREADS:
        with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
            os.chdir(folder)
            try:
                outcome, _ = simulate(thread, Path(folder), patch)
            finally:
                os.chdir(start)
        outcomes.append(outcome)
        if verbose:
            marks = "".join("x" if v else "." for v in (
                outcome.detected, outcome.cause_named, outcome.fix_printed))
            print(f"{marks}  {outcome.status:8} {thread.id}", flush=True)
    return outcomes


def main() -> None:
    outcomes = run_all(verbose="-q" not in sys.argv)
    total = len(outcomes)
    print(f"threads: {total}; detected: {sum(o.detected for o in outcomes)}; cause named: "
          f"{sum(o.cause_named for o in outcomes)}; fix printed: "
          f"{sum(o.fix_printed for o in outcomes)}; all three: {sum(o.all for o in outcomes)}")


if __name__ == "__main__":
    main()
