"""What the stall watch (STALL_TIMEOUT) costs a training step, and how long a stall takes to
be reported.

    .venv/bin/python benchmarks/stall_watch_cost.py [--rounds 3] [--epochs 10]
        [--replicas 1,2] [--calls 20000] [--stall-timeout 4] [--steps 2000]
        [--only train|run|stderr] [--lines 20000]

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
4. `mgpu run`: what the script's hooks (`launcher/run_watch.py`: every tf.function call
   and strategy.run) add to a step: a tf.function step under MirroredStrategy on
   `--replicas` logical CPU devices, called `--steps` times with the hooks and the watch
   and without, alternating, `--rounds` each (in a child per replica count: the device
   split is once per process); then the stall to report of a script that blocks
   (tests/fixtures/stall/stallscript.py) in each phase, and of `mgpu train --workers 2`
   whose worker 1 never joins the first all-reduce (STALL_TIMEOUT 20 there: a worker's
   first step waits for the other's compile).
5. Stderr's tail (`stderrtail`: fd 2 through a helper process that copies it and keeps the
   last lines, while the watch is on): `--lines` lines of 100 bytes written to fd 2 with
   libc's write (as C++ logs are), without the tail and with it, `--rounds` each,
   alternating, in a child whose stderr is a file; the writer's µs per line, and with the
   tail also until the helper has copied them all (`lines()` answers after that).
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
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STALLS = {"building the model": 1, "the first step": 2, "training steps": 25}


def per_call(calls: int) -> None:
    from mgpu_env.config.stalltime import StallTimeout
    from mgpu_env.training.multiworker.stall import StallWatch, Watched
    from mgpu_env.training.multiworker.stallhints import FIRST_STEP, Devices

    watch = StallWatch(StallTimeout(), Watched(Devices(2, "CPU", "none", {}), "resume"),
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


HOOK_COST = """
import os, statistics, sys, time
import tensorflow as tf
replicas = int(sys.argv[1]); steps = int(sys.argv[2]); rounds = int(sys.argv[3])
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
strategy = tf.distribute.MirroredStrategy(
    [f"/cpu:{i}" for i in range(replicas)],
    cross_device_ops=tf.distribute.ReductionToOneDevice())
with strategy.scope():
    w = tf.Variable(tf.ones((64, 64)))
def one(x):
    w.assign_sub(0.001 * tf.matmul(tf.transpose(x), tf.matmul(x, w)))
    return tf.reduce_sum(w)
x = tf.ones((8, 64))
def timed():
    # A new step function each time: traced (and so seen as a step) under the hooks or not.
    step = tf.function(lambda x: strategy.run(one, args=(x,)))
    step(x)
    started = time.perf_counter()
    for _ in range(steps):
        step(x)
    return (time.perf_counter() - started) / steps * 1e6
from mgpu_env.config.stalltime import StallTimeout
from mgpu_env.launcher import run_observer, run_watch
from mgpu_env.training.multiworker.stall import StallWatch, Watched
from mgpu_env.training.multiworker.stallhints import Devices, STEPS
on, off = [], []
for _ in range(rounds):
    off.append(timed())
    watch = StallWatch(StallTimeout(), Watched(Devices(replicas, "CPU", "reduction_to_one", {}),
                                               ""))
    run_watch._STATE.watch = watch
    run_observer.observe(); run_watch.hook_tensorflow()
    run_watch._STATE.step_functions.clear()
    watch.phase(STEPS)
    on.append(timed())
    assert watch.current == STEPS and len(watch._calls) > 1, "the hook saw no step"
    watch.stop(); run_watch._STATE.watch = None
print(f"{replicas} replica(s): {statistics.median(off):.1f} us/step without the hooks, "
      f"{statistics.median(on):.1f} us/step with them and the watch "
      f"({statistics.median(on) - statistics.median(off):+.1f} us); off {off}, on {on}")
"""


def hook_per_call(calls: int) -> None:
    """What `mgpu run`'s hook adds to one call of a step function (the wrapper over
    tf.function's __call__, then `call_done`), on a plain callable: no TensorFlow noise."""
    from mgpu_env.config.stalltime import StallTimeout
    from mgpu_env.launcher import run_watch
    from mgpu_env.training.multiworker.stall import StallWatch, Watched
    from mgpu_env.training.multiworker.stallhints import STEPS, Devices

    class Step:
        def __call__(self, x: int) -> int:
            return x

    class Hooked:
        __call__ = run_watch._function_wrapper(Step.__call__)

    plain, hooked = Step(), Hooked()
    watch = StallWatch(StallTimeout(), Watched(Devices(2, "CPU", "none", {}), ""),
                       on_stall=lambda report: None)
    run_watch._STATE.watch = watch
    run_watch._STATE.step_functions.add(id(hooked))
    watch.phase(STEPS)

    def timed(call: Callable[[int], int]) -> float:
        started = time.perf_counter()
        for _ in range(calls):
            call(1)
        return (time.perf_counter() - started) / calls * 1e6

    rounds = [(timed(plain), timed(hooked)) for _ in range(5)]
    watch.stop()
    run_watch._STATE.watch = None
    off, on = (statistics.median(r[i] for r in rounds) for i in (0, 1))
    print(f"mgpu run, per call of a step function: {off:.2f} us plain, {on:.2f} us hooked "
          f"and watched ({on - off:+.2f} us; median of 5 x {calls:,})")


def run_hooks(replicas: int, steps: int, rounds: int) -> None:
    result = subprocess.run([sys.executable, "-c", HOOK_COST, str(replicas), str(steps),
                             str(rounds)], capture_output=True, text=True, check=False,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
                                 "PYTHONPATH": str(REPO)})
    lines = result.stdout.strip().splitlines()
    print(lines[-1] if lines else result.stderr[-2000:])


RUN_STALLS = {"the first step": ("loop", 1), "training steps": ("fit-data", 5),
              "evaluating": ("fit-eval", 0), "saving the checkpoint": ("save", 4)}


def run_stall_to_report(folder: Path, timeout: float) -> None:
    script = REPO / "tests" / "fixtures" / "stall" / "stallscript.py"
    for phase, (mode, at) in RUN_STALLS.items():
        work = folder / f"run-{mode}"
        work.mkdir()
        mark = work / "mark"
        result = subprocess.run(
            [sys.executable, "-m", "entrypoint", "run", str(script)], cwd=work,
            capture_output=True, text=True, timeout=300, check=False,
            env=env(folder, VIRTUAL_DEVICES="2", STALL_IN=mode, STALL_AT=str(at),
                    STALL_MARK=str(mark), STALL_TIMEOUT=f"{timeout:g}"))
        waited = time.time() - float(mark.read_text())
        named = next((line for line in result.stderr.splitlines()
                      if line.startswith("error:")), "")
        print(f"mgpu run, stall in {phase}: exit {result.returncode}, {waited:.2f} s from "
              f"the block to the end\n  {named[:160]}")
    mark = folder / "mark-workers"
    bound = 20
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint", "train", "--workers", "2"], cwd=folder,
        capture_output=True, text=True, timeout=300, check=False,
        env=env(folder, OUTPUT_DIR=str(folder / "workers"), EPOCHS="2",
                PYTHONPATH=f"{REPO / 'tests' / 'fixtures' / 'stall'}:{REPO}",
                MODEL="stallmodel:build", STALL_AT="2", STALL_WORKER="1",
                STALL_MARK=str(mark), STALL_TIMEOUT=str(bound), WORKER_TIMEOUT="60"))
    waited = time.time() - float(mark.read_text())
    named = next((line for line in result.stderr.splitlines()
                  if line.startswith("mgpu: worker")), "")
    print(f"mgpu train --workers 2, worker 1 blocked in its first step: exit "
          f"{result.returncode}, {waited:.2f} s from the block to the launcher's end (bound "
          f"{bound} s)\n  {named[:200]}")


TAIL_COST = """
import ctypes, os, statistics, sys, time
from mgpu_env.training.multiworker.stderrtail import StderrTail
lines, rounds = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None)
line = b"I0000 00:00:1.000000  1234 nccl.cc:1] NCCL INFO a line of a C++ log, 100 bytes: "
line = line.ljust(99, b".") + b"\\n"
def written():
    started = time.perf_counter()
    for _ in range(lines):
        libc.write(2, line, len(line))
    return (time.perf_counter() - started) / lines * 1e6
off, on, copied = [], [], []
for _ in range(rounds):
    off.append(written())
    tail = StderrTail(os.dup(2), 30)
    started = time.perf_counter()
    on.append(written())
    assert tail.lines()[-1] == line.decode().rstrip()
    copied.append((time.perf_counter() - started) / lines * 1e6)
    tail.stop()
print(f"stderr's tail, per line written to fd 2: {statistics.median(off):.2f} us without, "
      f"{statistics.median(on):.2f} us with it, {statistics.median(copied):.2f} us until "
      f"copied (median of {rounds} x {lines:,}); without {off}, with {on}")
"""


def tail_per_line(folder: Path, lines: int, rounds: int) -> None:
    with (folder / "stderr.log").open("wb") as stderr:
        result = subprocess.run([sys.executable, "-c", TAIL_COST, str(lines), str(rounds)],
                                stdout=subprocess.PIPE, stderr=stderr, text=True, check=False,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    written = (folder / "stderr.log").stat().st_size
    print(result.stdout.strip() or (folder / "stderr.log").read_text()[-2000:])
    print(f"  ({written:,} bytes reached the child's stderr file, "
          f"{2 * rounds * lines * 100:,} written)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--stall-timeout", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--only", choices=("train", "run", "stderr"), default=None)
    parser.add_argument("--lines", type=int, default=20000)
    args = parser.parse_args()
    replicas = [int(r) for r in args.replicas.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.only in (None, "stderr"):
            tail_per_line(folder, args.lines, args.rounds)
        if args.only in (None, "train"):
            per_call(args.calls)
            for count in replicas:
                end_to_end(folder, count, args.epochs, args.rounds)
            stall_to_report(folder, args.stall_timeout)
        if args.only in (None, "run"):
            hook_per_call(args.calls)
            for count in replicas:
                run_hooks(count, args.steps, args.rounds)
            run_stall_to_report(folder, args.stall_timeout)


if __name__ == "__main__":
    main()
