"""What the memory check's child adds to a start: `mgpu train --dry-run` of the tutorial's
MLP timed against the child alone and a bare TensorFlow import, alternated.

    .venv/bin/python benchmarks/memory_check_cost.py [--runs 5] [--before DIR]

Each round times, in fresh processes with `GPUS=none DATASET=digits`: `mgpu train
--dry-run` on an empty cache (a first start: the child included), the same with the
estimate an earlier start kept (`memprobe.measure`'s cache: no child), the child alone
(`training.step.memprobe` with the MLP's request), and `python -c "import tensorflow"`,
every GPU hidden as the child has them.
`--before DIR`: a checkout without the check (e.g. `git archive <commit> | tar -x -C DIR`),
whose dry run is timed in the same rounds, first on PYTHONPATH. Prints each series' runs
and median; the estimate the child gave, against the MLP's real variables (784 -> 64 -> 64
-> 10: 55,050 float32 weights, Adam's two slots each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REQUEST = {"model": "mlp", "seed": 42, "input_shape": [784], "num_classes": 10,
           "per_replica_batch": 64, "learning_rate": 0.001,
           "precision": {"policy": "float32", "loss_scaling": False, "reason": "float32"}}
MLP_WEIGHTS = 784 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    # From HOME (a scratch folder): `python -m` puts the working folder first on sys.path,
    # which would shadow PYTHONPATH's checkout with the one run from.
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=env["HOME"], capture_output=True, text=True,
                          check=True)
    return time.perf_counter() - start, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", type=Path, help="a checkout without the memory check")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",)}
        env.update(HOME=scratch, GPUS="none", DATASET="digits", TF_CPP_MIN_LOG_LEVEL="2",
                   OUTPUT_DIR=str(Path(scratch) / "run"), PYTHONPATH=str(REPO))
        hidden = {**env, "CUDA_VISIBLE_DEVICES": "", "TF_ENABLED_DEVICE_TYPES": "CPU"}
        series: dict[str, list[float]] = {"dry run": [], "dry run, kept": [],
                                          "child alone": [], "import tensorflow": []}
        kept = {**env, "XDG_CACHE_HOME": str(Path(scratch) / "kept")}
        timed([sys.executable, "-m", "entrypoint", "train", "--dry-run"], kept)  # keeps it
        if args.before:
            series["dry run before"] = []
        answer = ""
        for number in range(args.runs):
            first = {**env, "XDG_CACHE_HOME": str(Path(scratch) / f"empty{number}")}
            if args.before:
                series["dry run before"].append(timed(
                    [sys.executable, "-m", "entrypoint", "train", "--dry-run"],
                    {**env, "PYTHONPATH": str(args.before)})[0])
            series["dry run"].append(timed(
                [sys.executable, "-m", "entrypoint", "train", "--dry-run"], first)[0])
            series["dry run, kept"].append(timed(
                [sys.executable, "-m", "entrypoint", "train", "--dry-run"], kept)[0])
            seconds, answer = timed([sys.executable, "-m", "mgpu_env.training.step.memprobe",
                                     json.dumps(REQUEST)], hidden)
            series["child alone"].append(seconds)
            series["import tensorflow"].append(
                timed([sys.executable, "-c", "import tensorflow"], hidden)[0])
    for name, values in series.items():
        runs = ", ".join(f"{value:.2f}" for value in values)
        print(f"{name:<18} median {statistics.median(values):.2f} s ({runs})")
    estimate = json.loads(answer.splitlines()[-1].split(" ", 1)[1])["estimate"]
    print(f"estimate: {estimate}")
    real = MLP_WEIGHTS * 4
    equal = estimate["weights"] == estimate["gradients"] == real and estimate["slots"] == 2 * real
    print(f"real: weights and gradients {real:,} B each, Adam's slots {2 * real:,} B; "
          f"equal: {equal}")


if __name__ == "__main__":
    main()
