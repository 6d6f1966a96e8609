"""Kept and streamed input as a share of synthetic, at 1 and 2 replicas, over repeated runs,
with the profiler's input wait and its pipeline threads' share of the cores beside it.

    .venv/bin/python benchmarks/stream_cost.py [--runs 2] [--rounds 8] [--profile 3]
        [--dataset digits] [--input-cost benchmarks/input_cost.py]

Runs `benchmarks/input_cost.py --stream` `--runs` times at each replica count (the CPU
split into 2 logical devices for 2, as `GPUS=none VIRTUAL_DEVICES=2` does), the replica
counts taking turns run by run (1, 2, 1, 2, ...) so that a change of the machine's load
between runs falls on both. Each run interleaves synthetic, kept (`ResidentFeed`) and
streamed (`StreamFeed`) intervals in one process and reports each feed's median share of
synthetic over its rounds. Printed per replica count and feed: the median over runs, the
runs' range and how far apart the runs land (points), by the wall clock (the throughput
asked for) and per CPU second of the process (steadier on a machine shared with other work);
then, with `--profile N` (passed on to input_cost.py), the share of the streamed intervals
TensorFlow's profiler saw the steps wait in the iterator (`mgpu_env.profile.wait`) beside
the wall clock's cost: the two readings of the input's cost. `--input-cost` runs another
copy of that script, e.g. an older checkout's, to compare before and after; a copy that
prints no CPU or wait line shows none.
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
WAIT = re.compile(r"^\s+(real|stream)\s+input wait\s+([\d.]+)% of its interval")
PIPELINE = re.compile(r"^\s+(real|stream)\s+pipeline\s+([\d.]+)% of the")
PROFILED = re.compile(r"^\s+(real|stream)\s+profiled\s+([\d.]+)% of the throughput")
NAMES = {"real": "kept", "stream": "streamed"}


def shares(output: str) -> dict[tuple[str, str], float]:
    """(feed, "wall", "cpu" or "wait") -> its median %, from one input_cost.py run: of
    synthetic for "wall" and "cpu", of the interval for "wait"."""
    found: dict[tuple[str, str], float] = {}
    for line in output.splitlines():
        for kind, pattern in (("wall", WALL), ("cpu", CPU), ("wait", WAIT),
                              ("pipe", PIPELINE), ("prof", PROFILED)):
            if match := pattern.match(line):
                found[NAMES[match[1]], kind] = float(match[2])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--profile", type=int, default=0, metavar="INTERVALS",
                        help="streamed intervals traced per run for the input wait (0: none)")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--input-cost", type=Path, default=REPO / "benchmarks/input_cost.py")
    args = parser.parse_args()

    runs: dict[int, list[dict[tuple[str, str], float]]] = {1: [], 2: []}
    for run in range(args.runs):
        for replicas in runs:
            command = [sys.executable, str(args.input_cost), "--stream", "--rounds",
                       str(args.rounds), "--replicas", str(replicas), "--dataset", args.dataset]
            if args.profile:
                command += ["--profile", str(args.profile)]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            runs[replicas].append(shares(done.stdout))
            print(f"{replicas} replica(s), run {run + 1}: " + ", ".join(
                f"{feed} {kind} {value:.1f}%" for (feed, kind), value in runs[replicas][-1].items()
            ), flush=True)
    for replicas, found in runs.items():
        print(f"{replicas} replica(s), {args.dataset}, {args.runs} runs of {args.rounds} "
              "interleaved rounds (median of runs, range, runs apart):")
        for key in found[0]:
            values = [r[key] for r in found if key in r]
            unit = {"wait": "of its interval", "pipe": "of the cores",
                    "prof": "of the throughput"}.get(key[1], "of synthetic")
            print(f"  {key[0]:8} {key[1]:4} {statistics.median(values):5.1f}% {unit} "
                  f"({min(values):.1f}-{max(values):.1f}, "
                  f"{max(values) - min(values):.1f} points apart)", flush=True)
        costs = [100 - r["streamed", "wall"] for r in found if ("streamed", "wall") in r]
        for key, what in (("wait", "input wait"), ("prof", "wait + pipeline")):
            values = [r["streamed", key] for r in found if ("streamed", key) in r]
            if costs and values:
                cost, value = statistics.median(costs), statistics.median(values)
                print(f"  streamed: {cost:.1f}% of throughput lost, the profiler's {what} "
                      f"{value:.1f}%: the readings {abs(cost - value):.1f} points apart",
                      flush=True)


if __name__ == "__main__":
    main()
