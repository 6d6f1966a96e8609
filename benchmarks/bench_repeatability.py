"""Does `mgpu bench`'s input cost hold from run to run? Runs it several times and compares.

    .venv/bin/python benchmarks/bench_repeatability.py [--runs 2] [--steps 166]
        [--intervals 30] [--warmup 50] [--keep DIR] [SETTING=VALUE ...]

Runs `mgpu bench` `--runs` times one after the other (by default `GPUS=none
VIRTUAL_DEVICES=2 BENCH_DATA=all`, the CPU split into 2 logical devices; SETTING=VALUE
arguments add or replace settings, e.g. DATASET=mnist BENCH_MODEL=resnet), each into a
folder of its own (kept with --keep), and prints for each input pipeline's cost (data x
replicas x precision x XLA) every run's value (the median over rounds, ± its 95%
confidence) and the largest disagreement between two runs in percentage points; the same
per CPU second of the process (CPU devices); then what each run's stream gave alone. The
goal: every cost within 5 points between two runs. Exits 1 when one is not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GOAL_POINTS = 5.0
DEFAULTS = {"GPUS": "none", "VIRTUAL_DEVICES": "2", "BENCH_DATA": "all",
            "TF_CPP_MIN_LOG_LEVEL": "3"}


def cost_key(cost: dict[str, Any]) -> str:
    return f"{cost['variant']}, {cost['replicas']} replica(s)"


def one_run(env: dict[str, str], folder: Path) -> dict[str, Any]:
    """One `mgpu bench` into `folder`; its bench.json."""
    done = subprocess.run(
        [sys.executable, "-m", "entrypoint", "bench"], cwd=REPO,
        env={**env, "OUTPUT_DIR": str(folder)}, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        sys.exit(f"mgpu bench failed with exit code {done.returncode}:\n{done.stderr[-2000:]}")
    data: dict[str, Any] = json.loads((folder / "bench.json").read_text())
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    # 166 steps: two of the stream's chunks of the MLP's batch of 64 MNIST-shaped rows, so
    # every interval takes as many (`mgpu bench` notes when BENCH_STEPS is not a multiple).
    parser.add_argument("--steps", type=int, default=166, help="BENCH_STEPS")
    parser.add_argument("--intervals", type=int, default=30, help="BENCH_INTERVALS")
    parser.add_argument("--warmup", type=int, default=50, help="BENCH_WARMUP")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep each run's bench.json and bench.png under DIR/runN")
    parser.add_argument("settings", nargs="*", metavar="SETTING=VALUE")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.settings)
    env = {**os.environ, **DEFAULTS, "BENCH_STEPS": str(args.steps),
           "BENCH_INTERVALS": str(args.intervals), "BENCH_WARMUP": str(args.warmup), **extra}
    shown = {k: env[k] for k in (*DEFAULTS, "BENCH_STEPS", "BENCH_INTERVALS", "BENCH_WARMUP",
                                 *extra) if k != "TF_CPP_MIN_LOG_LEVEL"}
    print("mgpu bench " + " ".join(f"{k}={v}" for k, v in shown.items())
          + f", {args.runs} runs", flush=True)

    costs: dict[str, list[tuple[float, float]]] = {}
    alone: dict[str, list[float | None]] = {}
    cpu_costs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-repeat-") as temp:
        for run in range(args.runs):
            data = one_run(env, (args.keep or Path(temp)) / f"run{run + 1}")
            for cost in data["input_pipeline_cost"]:
                costs.setdefault(cost_key(cost), []).append(
                    (100 * cost["throughput_lost"], 100 * cost["throughput_lost_ci95"])
                )
                if "cpu_throughput_lost" in cost:
                    cpu_costs.setdefault(cost_key(cost), []).append(
                        100 * cost["cpu_throughput_lost"])
            for verdict in data["input_alone"]:
                for row in verdict.get("by_replicas", ()):
                    key = f"{verdict['variant']}, {row['replicas']} replica(s)"
                    alone.setdefault(key, []).append(row["input_alone_samples_per_s"])
            print(f"run {run + 1} done: " + ", ".join(
                f"{cost_key(c)} {100 * c['throughput_lost']:.1f}%"
                for c in data["input_pipeline_cost"]), flush=True)

    print("input pipeline's cost, % of synthetic samples/s lost (median over rounds, "
          "± its 95% confidence):")
    worst = 0.0
    for key, values in costs.items():
        points = [value for value, _ in values]
        disagreement = max(points) - min(points)
        worst = max(worst, disagreement)
        runs = "  ".join(f"{value:5.1f}% ±{ci:4.1f}" for value, ci in values)
        print(f"  {key:34} {runs}  largest disagreement {disagreement:4.1f} points")
    for key, cpu in cpu_costs.items():
        print(f"  per CPU second, {key:20} " + "  ".join(f"{v:5.1f}%" for v in cpu)
              + f"  largest disagreement {max(cpu) - min(cpu):4.1f} points")
    for key, rates in alone.items():
        shown_rates = ", ".join(f"{r:,.0f}" if r else "-" for r in rates)
        print(f"  input alone, {key}: {shown_rates} samples/s")
    verdict = "within" if worst <= GOAL_POINTS else "NOT within"
    print(f"largest disagreement {worst:.1f} points: {verdict} the goal of "
          f"{GOAL_POINTS:.0f} points")
    return 0 if worst <= GOAL_POINTS else 1


if __name__ == "__main__":
    sys.exit(main())
