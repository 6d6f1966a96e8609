"""The seed's script and a tuned Keras `model.fit` against `mgpu train`, side by side.

    .venv/bin/python benchmarks/seed_vs_mgpu.py [--epochs 3] [--repeats 5] [--device cpu]
        [--mgpu-tree PATH]

All three train the seed's MLP on the same MNIST-shaped synthetic data (60000 rows of 784
values, 10 classes) with batch 64 on one replica of the same device, each in its own
process, in turn (seed, Keras, mgpu, seed, ...) so a machine shared with other work slows
each alike; the figures are medians over the repeats, with their range. The baselines:

- seed: the seed's `train` as written (`mgpu_env.training.tutorial`): numpy arrays into
  `model.fit`, `steps_per_execution` 1.
- keras: the seed's model compiled with `steps_per_execution=STEPS_PER_EXECUTION` and fed
  by tf.data the way the tf.data guide advises for data in memory (from_tensor_slices,
  cache, shuffle of the whole set, batch, prefetch with AUTOTUNE).

Samples/s counts the samples actually trained (the seed's `model.fit` trains the partial
last batch; the others drop it) over the seconds of all epochs, the first (tracing,
compiling) included; the steady-state figure leaves epoch 1 out. Each process's peak
resident memory (ru_maxrss) is printed too. `--mgpu-tree` measures another checkout's
`mgpu train` (e.g. an export of an older commit) against the same baselines.
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TRAIN_SAMPLES = 60_000
BATCH = 64
SEED = 42
STEPS_PER_EXECUTION = 50  # the issue's "tuned" Keras (as in Keras' own performance advice)
RESULT = "BASELINE_RESULT "


def _env(device: str, tree: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), TF_CPP_MIN_LOG_LEVEL="2")
    env["CUDA_VISIBLE_DEVICES"] = "-1" if device == "cpu" else "0"
    env.pop("TF_CONFIG", None)
    return env


def _data() -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(SEED)
    # As the seed prepares MNIST: uint8 pixels divided by 255.0 (float64), labels uint8.
    x_train = rng.integers(0, 256, (TRAIN_SAMPLES, 784), dtype=np.uint8) / 255.0
    y_train = rng.integers(0, 10, TRAIN_SAMPLES, dtype=np.uint8)
    return x_train, y_train


def _epoch_timer() -> Any:
    import tensorflow as tf

    class EpochTimer(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.seconds.append(time.perf_counter() - self._start)

    return EpochTimer()


def seed_child(epochs: int) -> None:
    """The seed's `train` on synthetic data; prints per-epoch seconds as JSON."""
    from mgpu_env.training import tutorial

    x_train, y_train = _data()
    timer = _epoch_timer()
    tutorial.train(x_train, y_train, epochs=epochs, batch_size=BATCH, callbacks=[timer])
    print(RESULT + json.dumps({"seconds": timer.seconds, "samples": TRAIN_SAMPLES}))


def keras_child(epochs: int) -> None:
    """A tuned `model.fit`: tf.data input, `steps_per_execution`; per-epoch seconds as JSON."""
    import tensorflow as tf

    from mgpu_env.training import tutorial

    x_train, y_train = _data()
    x_train = x_train.astype("float32")  # what a tuned pipeline feeds the float32 model
    dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .cache()
        .shuffle(TRAIN_SAMPLES, seed=SEED)
        .batch(BATCH, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = tutorial.seed_model()
        model.compile(loss="sparse_categorical_crossentropy", optimizer=model.optimizer,
                      metrics=["accuracy"], steps_per_execution=STEPS_PER_EXECUTION)
    timer = _epoch_timer()
    model.fit(dataset, epochs=epochs, callbacks=[timer], verbose=0)
    samples = (TRAIN_SAMPLES // BATCH) * BATCH
    print(RESULT + json.dumps({"seconds": timer.seconds, "samples": samples}))


def _run(command: list[str], env: dict[str, str], cwd: str | None = None) -> tuple[str, str, int]:
    """Run a child; its stdout, stderr and peak resident memory (KiB, from wait4)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command[-3:])} failed:\n{stderr[-3000:]}")
    return stdout, stderr, usage.ru_maxrss


def run_baseline(which: str, epochs: int, device: str) -> dict[str, float]:
    stdout, _, peak = _run(
        [sys.executable, __file__, f"--{which}-child", "--epochs", str(epochs)],
        _env(device, REPO),
    )
    line = next(t for t in stdout.splitlines() if t.startswith(RESULT))
    data = json.loads(line.removeprefix(RESULT))
    return _rates(data["seconds"], data["samples"], peak)


def run_mgpu(epochs: int, device: str, tree: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as scratch:
        env = _env(device, tree)
        env.update(
            GPUS="none" if device == "cpu" else "0", DATASET="synthetic", QUIET="1",
            EPOCHS=str(epochs), BATCH_SIZE=str(BATCH), VIRTUAL_DEVICES="0", SEED=str(SEED),
            OUTPUT_DIR=str(Path(scratch) / "run"),
        )
        if device == "gpu":
            env.pop("CUDA_VISIBLE_DEVICES")  # mgpu's GPUS=0 sets it
        _, _, peak = _run([sys.executable, "-m", "entrypoint", "train"], env, cwd=scratch)
        metrics = json.loads((Path(scratch) / "run" / "metrics.json").read_text())
    samples = (TRAIN_SAMPLES // metrics["global_batch_size"]) * metrics["global_batch_size"]
    return _rates([e["seconds"] for e in metrics["history"]], samples, peak)


def _rates(seconds: list[float], samples: int, peak_kib: int) -> dict[str, float]:
    steady = samples * (len(seconds) - 1) / sum(seconds[1:]) if len(seconds) > 1 else 0.0
    return {
        "all_epochs": samples * len(seconds) / sum(seconds),
        "after_epoch_1": steady,
        "peak_rss_mib": peak_kib / 1024,
    }


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):9,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--mgpu-tree", type=Path, default=REPO,
                        help="the checkout whose `mgpu train` runs (default: this one)")
    parser.add_argument("--seed-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keras-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seed_child:
        seed_child(args.epochs)
        return
    if args.keras_child:
        keras_child(args.epochs)
        return
    runs: dict[str, list[dict[str, float]]] = {"seed": [], "keras": [], "mgpu": []}
    for repeat in range(args.repeats):
        runs["seed"].append(run_baseline("seed", args.epochs, args.device))
        runs["keras"].append(run_baseline("keras", args.epochs, args.device))
        runs["mgpu"].append(run_mgpu(args.epochs, args.device, args.mgpu_tree))
        print(f"run {repeat + 1}: " + ", ".join(
            f"{name} {r[-1]['all_epochs']:,.0f} / {r[-1]['after_epoch_1']:,.0f} samples/s"
            for name, r in runs.items()
        ) + " (all epochs / after epoch 1)", flush=True)
    print(f"\n{args.epochs} epochs of 60000 MNIST-shaped samples, batch {BATCH}, one replica "
          f"on the {args.device.upper()}, median [range] of {args.repeats} alternating runs; "
          f"mgpu train from {args.mgpu_tree}:")
    for key, label in (("all_epochs", "all epochs"), ("after_epoch_1", "after epoch 1")):
        print(f"  {label}:")
        for name, results in runs.items():
            print(f"    {name:6} {_median_range([r[key] for r in results])} samples/s")
        mgpu = statistics.median(r[key] for r in runs["mgpu"])
        for base in ("seed", "keras"):
            ratios = [m[key] / b[key] for m, b in zip(runs["mgpu"], runs[base], strict=True)]
            of_medians = mgpu / statistics.median(r[key] for r in runs[base])
            print(f"    mgpu/{base:6} {of_medians:.2f}x (ratio of the medians; per run "
                  f"{min(ratios):.2f}-{max(ratios):.2f}x)")
    print("  peak resident memory (MiB): " + ", ".join(
        f"{name} {_median_range([r['peak_rss_mib'] for r in results]).strip()}"
        for name, results in runs.items()
    ))


if __name__ == "__main__":
    main()
