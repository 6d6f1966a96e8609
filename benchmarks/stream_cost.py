"""Kept and streamed input as a share of synthetic, at 1 and 2 replicas, over repeated runs.

    .venv/bin/python benchmarks/stream_cost.py [--runs 3] [--rounds 8] [--dataset digits]
        [--input-cost benchmarks/input_cost.py]

Runs `benchmarks/input_cost.py --stream` `--runs` times at each replica count (the CPU
split into 2 logical devices for 2, as `GPUS=none VIRTUAL_DEVICES=2` does), each run
interleaving synthetic, kept (`ResidentFeed`) and streamed (`StreamFeed`) intervals in one
process, and prints per feed the median over runs of each run's median share of synthetic,
with the range of those medians: by the wall clock (the throughput asked for) and per CPU
second of the process (steadier on a machine shared with other work). `--input-cost` runs
another copy of that script, e.g. an older checkout's, to compare before and after; a copy
that prints no CPU line shows none.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WALL = re.compile(r"^\s+(real|stream)\s+[\d,]+ samples/s\s+([\d.]+)% of synthetic")
CPU = re.compile(r"^\s+(real|stream)\s+per CPU second\s+([\d.]+)% of synthetic")
NAMES = {"real": "kept", "stream": "streamed"}


def shares(output: str) -> dict[tuple[str, str], float]:
    """(feed, "wall" or "cpu") -> its median % of synthetic, from one input_cost.py run."""
    found: dict[tuple[str, str], float] = {}
    for line in output.splitlines():
        for kind, pattern in (("wall", WALL), ("cpu", CPU)):
            if match := pattern.match(line):
                found[NAMES[match[1]], kind] = float(match[2])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--input-cost", type=Path, default=REPO / "benchmarks/input_cost.py")
    args = parser.parse_args()

    for replicas in (1, 2):
        runs: list[dict[tuple[str, str], float]] = []
        for run in range(args.runs):
            done = subprocess.run(
                [sys.executable, str(args.input_cost), "--stream", "--rounds", str(args.rounds),
                 "--replicas", str(replicas), "--dataset", args.dataset],
                capture_output=True, text=True, check=True,
            )
            runs.append(shares(done.stdout))
            print(f"{replicas} replica(s), run {run + 1}: " + ", ".join(
                f"{feed} {kind} {value:.1f}%" for (feed, kind), value in runs[-1].items()
            ), flush=True)
        print(f"{replicas} replica(s), {args.dataset}, {args.runs} runs of {args.rounds} "
              "interleaved rounds, % of synthetic (median of runs, range):")
        for key in runs[0]:
            values = [r[key] for r in runs if key in r]
            print(f"  {key[0]:8} {key[1]:4} {statistics.median(values):5.1f}% "
                  f"({min(values):.1f}-{max(values):.1f})", flush=True)


if __name__ == "__main__":
    main()
