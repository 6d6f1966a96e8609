"""What feeding the step costs, with the feeds' intervals interleaved in one process.

    .venv/bin/python benchmarks/input_cost.py [--replicas 2] [--dataset digits]
        [--steps 200] [--lead-in STEPS] [--rounds 8] [--stream] [--profile INTERVALS]

`mgpu bench BENCH_DATA=all` now takes turns the same way (`mgpu_env/bench/rounds.py`, one
process per replica count); before, it measured each point in a process of its own, one
after the other, and on a machine shared with other work the load changed between points
and the input's cost drowned in it. Here the same step (the training module's, on the
seed's MLP, batch 64 per replica, fp32, CPU split into `--replicas` logical devices) is fed
three ways in one process, taking turns interval by interval, so a change of load hits
each alike:

- synthetic: one batch already on each device, reused every step (`mgpu bench`'s
  `SameBatchFeed`): the step with no input at all;
- real: the rows kept on each device, batches gathered by index in the step (`ResidentFeed`,
  what `mgpu train` uses for data that fits);
- stream (with `--stream`): the tf.data path for data that does not fit (`StreamFeed`).
  Its pipeline's threads keep working ahead between its own intervals, so on a machine of
  few cores they slow the other feeds too, and its interval would start with chunks cut in
  the others' time: each interval therefore starts with `--lead-in` untimed steps (as many
  as `--steps` by default), which use up what was cut ahead, so the timed steps pay for
  their own input.

Prints each feed's median samples/s and the median over rounds of the per-round ratio to
synthetic, with its range; then the same ratio of samples per CPU second of this process
(all its threads): on a machine shared with other work, the CPU a feed costs is steadier
than the wall clock. With `--profile N`, N more intervals of each feed, taking turns, are
traced by TensorFlow's profiler and the share of each interval its steps waited in the
iterator's get-next ops is printed, the share of the cores tf.data's pipeline threads took,
and their sum (`mgpu_env.profile.wait`): a second reading of the input's cost, read from the
trace rather than from the throughput (on CPU devices the step computes on the cores the
pipeline takes, so both count). `benchmarks/stream_cost.py` repeats
this script and sums it up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

BATCH = 64
SEED = 42


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--steps", type=int, default=200, help="steps per interval")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument(
        "--lead-in", type=int, default=None,
        help="untimed steps at the start of each interval (default: as many as --steps)",
    )
    parser.add_argument("--profile", type=int, default=0, metavar="INTERVALS",
                        help="intervals of each feed traced for its input wait (0: none)")
    args = parser.parse_args()

    from mgpu_env.hardware.devices import DeviceSplit, apply_split

    devices = (
        apply_split(DeviceSplit("CPU", 1, args.replicas)) if args.replicas > 1
        else ("/device:CPU:0",)
    )
    from mgpu_env.bench.synthetic import SameBatchFeed
    from mgpu_env.runtime.precision import FLOAT32, PrecisionChoice
    from mgpu_env.runtime.strategy import make_strategy, plan_strategy
    from mgpu_env.training.input.data import FEATURES, load_arrays, resolve_dataset
    from mgpu_env.training.input.feeds import ResidentFeed, StreamFeed, plan_feed
    from mgpu_env.training.input.keep import FALLBACK
    from mgpu_env.training.shared.position import Position
    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.model import build_model
    from mgpu_env.training.step.steps import StepSpec

    strategy = make_strategy(plan_strategy("auto", DeviceSplit("CPU", 1, len(devices))))
    global_batch = BATCH * args.replicas
    arrays = load_arrays(resolve_dataset(args.dataset, None), SEED)

    def trainer() -> Any:
        return build_trainer(
            strategy, lambda: build_model(SEED),
            StepSpec(learning_rate=0.001,
                     precision=PrecisionChoice(FLOAT32, False, "benchmark"),
                     global_batch_size=global_batch, jit_compile=False),
        )

    lead_in = args.steps if args.lead_in is None else args.lead_in
    total = (lead_in + args.steps) * (args.rounds + 1 + args.profile)
    feeds: dict[str, tuple[Any, Any]] = {}
    synthetic = trainer()
    same = SameBatchFeed.make(strategy, BATCH, (FEATURES,), 10, SEED)
    feeds["synthetic"] = (synthetic, synthetic.loops.runner(same.source(Position(0))))
    real = trainer()
    # Every feed takes the plan's count (the same for kept and streamed arrays).
    per_epoch = plan_feed(arrays, FALLBACK, global_batch).steps_per_epoch
    resident = ResidentFeed.place(strategy, arrays, global_batch, SEED, steps_per_epoch=per_epoch)
    feeds["real"] = (real, real.loops.runner(resident.source(
        Position(0), -(-total // resident.steps_per_epoch))))
    if args.stream:
        streamed = trainer()
        stream = StreamFeed(strategy, arrays, global_batch, SEED, steps_per_call=args.steps,
                            steps_per_epoch=per_epoch)
        feeds["stream"] = (streamed, streamed.loops.runner(stream.source(
            Position(0), -(-total // stream.steps_per_epoch))))

    cpu_rates: dict[str, list[float]] = {name: [] for name in feeds}

    def interval(name: str) -> float:
        state, run = feeds[name]
        if lead_in:
            run(lead_in)
            state.optimizer.iterations.numpy()
        start, cpu_start = time.perf_counter(), time.process_time()
        run(args.steps)
        state.optimizer.iterations.numpy()  # waits for the steps queued
        cpu_rates[name].append(args.steps * global_batch / (time.process_time() - cpu_start))
        return args.steps * global_batch / (time.perf_counter() - start)

    for name in feeds:  # warm-up: tracing, allocation
        interval(name)
        cpu_rates[name].clear()
    rates: dict[str, list[float]] = {name: [] for name in feeds}
    for _ in range(args.rounds):
        for name in feeds:
            rates[name].append(interval(name))
    print(f"{args.dataset}, {args.replicas} replica(s), batch {BATCH} per replica, "
          f"{args.rounds} rounds of {args.steps} steps, feeds interleaved:")
    for name, values in rates.items():
        line = f"  {name:9} {statistics.median(values):9,.0f} samples/s"
        if name != "synthetic":
            ratios = [v / s for v, s in zip(values, rates["synthetic"], strict=True)]
            line += (f"   {100 * statistics.median(ratios):5.1f}% of synthetic "
                     f"(rounds {100 * min(ratios):.0f}-{100 * max(ratios):.0f}%)")
        print(line, flush=True)
    for name, values in cpu_rates.items():
        if name != "synthetic":
            ratios = [v / s for v, s in zip(values, cpu_rates["synthetic"], strict=True)]
            print(f"  {name:9} per CPU second {100 * statistics.median(ratios):5.1f}% of "
                  f"synthetic (rounds {100 * min(ratios):.0f}-{100 * max(ratios):.0f}%)",
                  flush=True)
    if args.profile:
        profile_waits(feeds, args.profile, lead_in, args.steps)


def profile_waits(feeds: dict[str, tuple[Any, Any]], intervals: int, lead_in: int,
                  steps: int) -> None:
    """Trace `intervals` more intervals of each feed, taking turns; print each feed's median
    share of its interval spent waiting for input, its pipeline threads' median share of the
    cores, and their sum: the input's cost as the trace reads it where the step computes on
    the host's cores, as here (`mgpu_env.profile.wait`)."""
    import tempfile

    from mgpu_env.profile.wait import trace_wait

    readings: dict[str, list[Any]] = {name: [] for name in feeds}
    with tempfile.TemporaryDirectory() as logdir:
        for number in range(intervals):
            for name, (state, run) in feeds.items():
                if lead_in:
                    run(lead_in)
                    state.optimizer.iterations.numpy()

                def interval(state: Any = state, run: Any = run) -> None:
                    run(steps)
                    state.optimizer.iterations.numpy()

                readings[name].append(trace_wait(Path(logdir) / f"{name}{number}", interval))
    for name, found in readings.items():
        for label, values, unit in (
            ("input wait", [r.share for r in found], "of its interval"),
            ("pipeline", [r.pipeline_share for r in found],
             f"of the {found[0].cores} cores"),
            ("profiled", [r.cost_share(step_on_host=True) for r in found],
             "of the throughput (wait + pipeline)"),
        ):
            print(f"  {name:9} {label} {100 * statistics.median(values):5.1f}% {unit} "
                  f"(TensorFlow's profiler, {intervals} traced, "
                  f"{100 * min(values):.1f}-{100 * max(values):.1f}%)", flush=True)


if __name__ == "__main__":
    main()
