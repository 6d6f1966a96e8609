"""What the stall watch (STALL_TIMEOUT) costs a training step, and how long a stall takes to
be reported.

    .venv/bin/python benchmarks/stall_watch_cost.py [--rounds 3] [--epochs 10]
        [--replicas 1,2] [--calls 20000] [--stall-timeout 4]

1. Per call of steps: `StallWatch.call_done()` (what each call's end adds: a lock, a
   deque, faulthandler's timer re-armed), timed `--calls` times in this process, no
   TensorFlow; the same for `phase()`.
2. End to end: `mgpu train` on digits (GPUS=none, the CPU split into each of `--replicas`
   logical devices), STALL_TIMEOUT=0 and auto alternating, `--rounds` each; prints the
   median milliseconds per step (from metrics.json's samples per second) of each and the
   difference. Steps run in calls of up to 200 (one call per epoch here), so the watch
   is touched once per call: the per-call cost in 1. over a call's steps is its cost per
   step, the end-to-end runs show it is lost in the noise.
3. Stall to report: the test hook that blocks (tests/fixtures/stall) in the model's build,
   the first step and the steps, STALL_TIMEOUT=`--stall-timeout`: the seconds from the
   block's start to the process's end, per phase.
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
sys.path.insert(0, str(REPO))

STALLS = {"building the model": 1, "the first step": 2, "training steps": 25}


def per_call(calls: int) -> None:
    from mgpu_env.config.stalltime import StallTimeout
    from mgpu_env.training.multiworker.stall import StallWatch
    from mgpu_env.training.multiworker.stallhints import FIRST_STEP, Devices

    watch = StallWatch(StallTimeout(), Devices(2, "CPU", "none", {}), "resume",
                       on_stall=lambda report: None)
    watch.phase(FIRST_STEP)
    started = time.perf_counter()
    for _ in range(calls):
        watch.call_done()
    done = (time.perf_counter() - started) / calls
    started = time.perf_counter()
    for _ in range(calls):
        watch.phase(FIRST_STEP)
    phase = (time.perf_counter() - started) / calls
    watch.stop()
    print(f"per call of steps: call_done() {done * 1e6:.1f} us, phase() {phase * 1e6:.1f} us "
          f"(the mean of {calls:,} calls)")


def env(folder: Path, **settings: str) -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "GPUS": "none", "DATASET": "digits",
            "QUIET": "1", "HOME": str(folder / "home"), "PYTHONPATH": str(REPO), **settings}


def step_ms(folder: Path, replicas: int, epochs: int, timeout: str, index: int) -> float:
    out = folder / f"r{replicas}-{timeout}-{index}"
    subprocess.run([sys.executable, "-m", "entrypoint", "train"], check=True, cwd=folder,
                   capture_output=True, env=env(folder, OUTPUT_DIR=str(out), EPOCHS=str(epochs),
                                                VIRTUAL_DEVICES=str(replicas),
                                                STALL_TIMEOUT=timeout))
    metrics = json.loads((out / "metrics.json").read_text())
    return 1000.0 * metrics["global_batch_size"] / metrics["train_samples_per_sec"]


def end_to_end(folder: Path, replicas: int, epochs: int, rounds: int) -> None:
    times: dict[str, list[float]] = {"0": [], "auto": []}
    for index in range(rounds):
        for timeout in times:
            times[timeout].append(step_ms(folder, replicas, epochs, timeout, index))
    off, on = (statistics.median(times[t]) for t in ("0", "auto"))
    print(f"{replicas} replica(s): {off:.3f} ms/step off, {on:.3f} ms/step auto "
          f"({(on - off) / off * 100:+.1f}%); off {times['0']}, auto {times['auto']}")


def stall_to_report(folder: Path, timeout: float) -> None:
    hooks = REPO / "tests" / "fixtures" / "stall"
    for phase, at in STALLS.items():
        mark = folder / f"mark-{at}"
        result = subprocess.run(
            [sys.executable, "-m", "entrypoint", "train"], cwd=folder, capture_output=True,
            text=True, env=env(folder, OUTPUT_DIR=str(folder / f"stall-{at}"), EPOCHS="2",
                               PYTHONPATH=f"{hooks}:{REPO}", MODEL="stallmodel:build",
                               STALL_AT=str(at), STALL_MARK=str(mark),
                               STALL_TIMEOUT=f"{timeout:g}"), timeout=300, check=False)
        waited = time.time() - float(mark.read_text())
        named = result.stderr.splitlines()[0] if result.stderr else ""
        print(f"stall in {phase}: exit {result.returncode}, {waited:.2f} s from the block to "
              f"the end (bound {timeout:g} s from the phase's last progress)\n  {named}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--stall-timeout", type=float, default=4.0)
    args = parser.parse_args()
    per_call(args.calls)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for replicas in (int(r) for r in args.replicas.split(",")):
            end_to_end(folder, replicas, args.epochs, args.rounds)
        stall_to_report(folder, args.stall_timeout)


if __name__ == "__main__":
    main()
