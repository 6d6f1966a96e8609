"""Peak memory of the stream that serves data too big for the devices, over the data's size.

    .venv/bin/python benchmarks/stream_memory.py [--rows 700000] [--steps 200]

Makes `--rows` random rows of 784 float32 (700,000 rows: 2.2 GB, over the 2 GiB a device
keeps), lets `plan_feed` choose (it must pick the stream), trains the seed's MLP for
`--steps` steps on one CPU replica and prints the peak resident memory (ru_maxrss) after the
data is made and after training, with what the stream added in units of the data's size.
The stream reads batches out of the caller's arrays: it must add no whole copy of them.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

BATCH = 64
SEED = 42


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=700_000)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    import numpy as np

    from mgpu_env.hardware.devices import DeviceSplit
    from mgpu_env.runtime.precision import FLOAT32, PrecisionChoice
    from mgpu_env.runtime.strategy import make_strategy, plan_strategy
    from mgpu_env.training.input.data import CLASSES, FEATURES, Arrays
    from mgpu_env.training.input.feeds import FeedMaking, make_feed, plan_feed
    from mgpu_env.training.input.keep import FALLBACK
    from mgpu_env.training.shared.position import Position
    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.model import build_model
    from mgpu_env.training.step.steps import StepSpec

    rng = np.random.default_rng(SEED)
    x = rng.random((args.rows, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, args.rows).astype(np.int32)
    arrays = Arrays("random", x, y, x[:BATCH], y[:BATCH])
    data_mib = (x.nbytes + y.nbytes) / 1024**2
    strategy = make_strategy(plan_strategy("auto", DeviceSplit("CPU", 1)))
    trainer = build_trainer(
        strategy, lambda: build_model(SEED),
        StepSpec(learning_rate=0.001, precision=PrecisionChoice(FLOAT32, False, "benchmark"),
                 global_batch_size=BATCH, jit_compile=False),
    )
    before = peak_mib()
    feed = make_feed(FeedMaking(strategy, arrays, plan_feed(arrays, FALLBACK, BATCH), BATCH, SEED))
    start = time.perf_counter()
    trainer.loops.runner(feed.source(Position(0)))(args.steps)
    steps = int(trainer.optimizer.iterations.numpy())
    seconds = time.perf_counter() - start
    after = peak_mib()
    print(f"{args.rows:,} rows, {data_mib:,.0f} MiB of data, fed by {type(feed).__name__}: "
          f"{steps} steps in {seconds:.1f} s")
    print(f"  peak RSS with the data and the model: {before:,.0f} MiB")
    print(f"  peak RSS after training:              {after:,.0f} MiB "
          f"(+{after - before:,.0f} MiB, {(after - before) / data_mib:.2f} x the data)")


if __name__ == "__main__":
    main()
