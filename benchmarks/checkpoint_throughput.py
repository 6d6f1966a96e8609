"""Training throughput of `mgpu train` with and without checkpoints inside the epoch.

    .venv/bin/python benchmarks/checkpoint_throughput.py [--rounds 3] [--intervals 0,10m,1s]
        [--epochs 3] [--dataset synthetic] [--batch-size 32]

Each round runs `mgpu train` once per `--intervals` value (CHECKPOINT_EVERY), alternated in
one process so a change in the machine's load hits each alike, each in a fresh run folder
(GPUS=none, QUIET=1). Printed per run and per interval (median over the rounds): the
training samples/s metrics.json records (the epochs' time: every checkpoint saved inside
them is counted in it, the epochs' own ends are not) and the checkpoints saved. `0` is
epoch ends only; `10m` the default, which in these seconds-long epochs saves nothing more;
`1s` saves about every second (as 10m would in an epoch of an hour, 600 times more often).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(args: argparse.Namespace, work: Path, interval: str, index: int) -> dict[str, float]:
    output = work / f"run-{index}-{interval}"
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "WORKER_HOSTS", "WORKER_INDEX", "MGPU_DEBUG")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", GPUS="none", QUIET="1",
               DATASET=args.dataset, BATCH_SIZE=str(args.batch_size), EPOCHS=str(args.epochs),
               CHECKPOINT_EVERY=interval, OUTPUT_DIR=str(output))
    subprocess.run([sys.executable, "-m", "entrypoint", "train"], cwd=work, env=env,
                   check=True, capture_output=True, timeout=1800)
    found = json.loads((output / "metrics.json").read_text())
    return {"samples_per_sec": float(found["train_samples_per_sec"]),
            "saves": float(found["checkpoint"]["saves"]),
            "mean_seconds": float(found["checkpoint"].get("mean_seconds", 0.0))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--intervals", default="0,10m,1s")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    intervals = [i.strip() for i in args.intervals.split(",") if i.strip()]
    seen: dict[str, list[dict[str, float]]] = {i: [] for i in intervals}
    with tempfile.TemporaryDirectory(prefix="ckpt-throughput-") as tmp:
        for index in range(args.rounds):
            for interval in intervals:
                got = run(args, Path(tmp), interval, index)
                seen[interval].append(got)
                print(f"round {index} CHECKPOINT_EVERY={interval:>4}: "
                      f"{got['samples_per_sec']:,.0f} samples/s, {got['saves']:.0f} saves "
                      f"({got['mean_seconds']:.3f} s each)", flush=True)
    base = statistics.median(r["samples_per_sec"] for r in seen[intervals[0]])
    for interval in intervals:
        rate = statistics.median(r["samples_per_sec"] for r in seen[interval])
        saves = statistics.median(r["saves"] for r in seen[interval])
        print(f"CHECKPOINT_EVERY={interval:>4}: median {rate:,.0f} samples/s "
              f"({rate / base:.1%} of {intervals[0]}), {saves:.0f} saves a run")


if __name__ == "__main__":
    main()
