"""The scripts of tests/run_scripts/ under `mgpu run`: what mgpu said about each run, held
against what each one is known to do (its case in CASES).

    .venv/bin/python -m tests.run_scripts.measure [--repo PATH] [NAME...]   # repo root

For each script one block: the exit code, every `mgpu run` line on stderr after the start
summary's first line, and per case `true` (every claim a true report makes is there) or
`untrue` (the report claims what did not happen: `refuse`). `--repo` runs another checkout's
mgpu (`git archive` of an earlier commit: the "before").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.children import REPO, child_env

FOLDER = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Case:
    script: str  # under tests/run_scripts/
    settings: dict[str, str] = field(default_factory=dict)
    expect: tuple[str, ...] = ()  # what a true report says (substrings of stderr)
    refuse: tuple[str, ...] = ()  # what an untrue report says


# A strategy said to agree with the plan (the precision's "as planned" names its setting).
STRATEGY_AS_PLANNED = "as planned (VIRTUAL_DEVICES planned 2)"
CASES = [
    Case("first_of_four.py", expect=(
        "strategy that ran: MirroredStrategy on 2 devices (CPU:0, CPU:1)",),
        refuse=("strategy that ran: CentralStorageStrategy",)),
    Case("named_gpus.py", expect=("GPU:0, GPU:1", "TensorFlow does not list"),
         refuse=(STRATEGY_AS_PLANNED,)),
    Case("dtensor_mesh.py", {"MIXED_PRECISION": "bf16"},
         expect=("8 devices", "float32"),
         refuse=("none built", "compute in mixed_bfloat16")),
    Case("keras3_clear_session.py", {"MIXED_PRECISION": "bf16"},
         expect=("keras3_clear_session.py:6", "float32"),
         refuse=("set its own precision policy",)),
    Case("own_policy.py", expect=("own_policy.py:5", "float16")),
    Case("tpu_else_default_fit.py", expect=("TensorFlow's default", "1 replica"),
         refuse=(STRATEGY_AS_PLANNED,)),
    Case("tpu_else_mirrored_loop.py", expect=(
        "strategy that ran: MirroredStrategy on 2 devices (CPU:0, CPU:1)", "strategy.run"),),
    Case("fails_at_import.py", refuse=("strategy that ran", "Fix: build")),
]
JUDGE = [
    Case("judge/central_storage.py", expect=("CentralStorageStrategy",)),
    Case("judge/keras3_train_step.py", {"MIXED_PRECISION": "bf16"},
         expect=("MirroredStrategy on 2 devices", "bfloat16")),
    Case("judge/no_strategy_loop.py", expect=("TensorFlow's default",)),
    Case("judge/mwms_then_fails.py", expect=("MultiWorkerMirroredStrategy on 1 device",)),
    Case("judge/built_then_fails.py", refuse=("strategy that ran", "Fix: build", "Fix: use")),
]


def run(case: Case, folder: Path, repo: Path) -> subprocess.CompletedProcess[str]:
    env = child_env(folder / "home", GPUS="none", VIRTUAL_DEVICES="2", QUIET="0",
                    TF_CPP_MIN_LOG_LEVEL="2", **case.settings)
    env["PYTHONPATH"] = str(repo)
    return subprocess.run([sys.executable, "-m", "entrypoint", "run",
                           str(FOLDER / case.script)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)


def judge(case: Case, stderr: str) -> str:
    missing = [text for text in case.expect if text not in stderr]
    said = [text for text in case.refuse if text in stderr]
    return "true" if not missing and not said else f"untrue (missing {missing}, said {said})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", default=str(REPO), help="the checkout whose mgpu to run")
    parser.add_argument("--judge", action="store_true", help="the scripts kept apart")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    cases = JUDGE if args.judge else CASES
    counts: dict[str, int] = {}
    for case in cases:
        if args.names and case.script not in args.names:
            continue
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            result = run(case, Path(folder), Path(args.repo))
        lines = [line for line in result.stderr.splitlines()
                 if line.startswith(("mgpu run", "  ")) or "Error" in line][1:]
        verdict = judge(case, result.stderr)
        counts[verdict.split()[0]] = counts.get(verdict.split()[0], 0) + 1
        print(f"== {case.script} {case.settings or ''} exit {result.returncode} "
              f"({time.perf_counter() - started:.0f} s): {verdict}")
        print("\n".join(f"   {line[:400]}" for line in lines), flush=True)
    print(f"TOTAL {counts} of {sum(counts.values())}")


if __name__ == "__main__":
    main()
