"""What TensorFlow's profiler costs a step, and the split it gives: `mgpu bench --explain`'s
and `mgpu train --profile`'s measurement, measured.

    .venv/bin/python benchmarks/profiler_overhead.py [--model mlp] [--replicas 2]
        [--batch 64] [--steps 20] [--rounds 5]

One process, the CPU split into `--replicas` logical devices, the packaged trainer (Adam,
float32) on one synthetic batch per replica. Rounds of `--steps` single-step calls timed
unprofiled, then the same under the profiler (each in its `train` step marker, as
`profile.trace` runs them), alternating; prints the median milliseconds per step of each
and their ratio (the profiler's cost per step), the profiler's fixed cost per session
(start, and stop with the session written), and the last round's split (xprof's
converter). With the profiler off nothing of it is imported (`mgpu train` without PROFILE;
tested in tests/processes/test_bench_explain.py), so "off" costs nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=("mlp", "resnet", "resnet50"))
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="per replica")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from mgpu_env.hardware.devices import DeviceSplit, apply_split

    devices = apply_split(DeviceSplit("CPU", 1, args.replicas)) if args.replicas > 1 else (
        "/device:CPU:0",)
    import tensorflow as tf

    from mgpu_env.bench.models import SHAPES, build_model
    from mgpu_env.bench.synthetic import SameBatchFeed
    from mgpu_env.profile.split import CATEGORIES, convert, xspace_files
    from mgpu_env.runtime.precision import choose_precision
    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.steps import StepSpec

    strategy = tf.distribute.MirroredStrategy(
        list(devices), cross_device_ops=tf.distribute.ReductionToOneDevice())
    shape = SHAPES[args.model]
    trainer = build_trainer(
        strategy, lambda: build_model(args.model, 1, shape),
        StepSpec(learning_rate=0.001, precision=choose_precision("0", "CPU", (), frozenset()),
                 global_batch_size=args.batch * args.replicas, jit_compile=False))
    batches = SameBatchFeed.make(strategy, args.batch, shape.input_shape, shape.classes, 1)

    @tf.function
    def one_step(source: object) -> None:
        strategy.run(trainer.steps.replica_step, args=next(source))

    def step() -> None:
        one_step(batches.batches)
        trainer.optimizer.iterations.numpy()

    step()
    plain, profiled, fixed = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            plain.append((time.perf_counter() - start) / args.steps)
            logdir = Path(folder) / str(round_)
            start = time.perf_counter()
            tf.profiler.experimental.start(str(logdir))
            started = time.perf_counter()
            for number in range(args.steps):
                with tf.profiler.experimental.Trace("train", step_num=number, _r=1):
                    step()
            stepped = time.perf_counter()
            tf.profiler.experimental.stop()
            fixed.append(started - start + time.perf_counter() - stepped)
            profiled.append((stepped - started) / args.steps)
        split = convert(xspace_files(logdir))
    print(f"{args.model}, {args.replicas} logical CPU replica(s), batch {args.batch} per "
          f"replica, {args.rounds} rounds of {args.steps} steps")
    print(f"unprofiled: {1000 * statistics.median(plain):.2f} ms/step "
          f"({', '.join(f'{1000 * t:.2f}' for t in plain)})")
    print(f"profiled:   {1000 * statistics.median(profiled):.2f} ms/step "
          f"({', '.join(f'{1000 * t:.2f}' for t in profiled)})")
    print(f"profiled / unprofiled: {statistics.median(profiled) / statistics.median(plain):.2f}")
    print(f"the profiler's start and stop (session written): {1000 * statistics.median(fixed):.0f}"
          f" ms per session ({', '.join(f'{1000 * t:.0f}' for t in fixed)})")
    print(f"split of the last round (xprof): {split.step_ms:.2f} ms per step; " + ", ".join(
        f"{name} {100 * split.share(key):.0f}%" for key, _, name in CATEGORIES
        if split.ms[key]))


if __name__ == "__main__":
    main()
