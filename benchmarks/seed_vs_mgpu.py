"""The seed's script against `mgpu train`, side by side: same model, data, device, batch.

    .venv/bin/python benchmarks/seed_vs_mgpu.py [--epochs 3] [--repeats 1] [--device cpu]

Both train the seed's MLP on the same MNIST-shaped synthetic data (60000 rows of 784
values, 10 classes) with batch 64 on one replica of the same device, each in its own
process, alternating when repeated. Samples/s counts the samples actually trained (the
seed's `model.fit` trains the partial last batch, `mgpu train` drops it) over the wall time
of all epochs, the first (tracing, compiling) included; the steady-state figure leaves
epoch 1 out. Prints both and the ratio mgpu/seed (the target is >= 1.5 on the CPU).
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


def _env(device: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    env["CUDA_VISIBLE_DEVICES"] = "-1" if device == "cpu" else "0"
    env.pop("TF_CONFIG", None)
    return env


def seed_child(epochs: int) -> None:
    """Run the seed's `train` on synthetic data; print per-epoch seconds as JSON."""
    import numpy as np
    import tensorflow as tf

    from mgpu_env.training import seed

    rng = np.random.default_rng(SEED)
    # As the seed prepares MNIST: uint8 pixels divided by 255.0 (float64), labels uint8.
    x_train = rng.integers(0, 256, (TRAIN_SAMPLES, 784), dtype=np.uint8) / 255.0
    y_train = rng.integers(0, 10, TRAIN_SAMPLES, dtype=np.uint8)

    class EpochTimer(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.seconds.append(time.perf_counter() - self._start)

    timer = EpochTimer()
    seed.train(x_train, y_train, epochs=epochs, batch_size=BATCH, callbacks=[timer])
    print("SEED_RESULT " + json.dumps({"seconds": timer.seconds, "samples": TRAIN_SAMPLES}))


def run_seed(epochs: int, device: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--seed-child", "--epochs", str(epochs)],
        env=_env(device), capture_output=True, text=True, check=False,
    )
    line = next((t for t in out.stdout.splitlines() if t.startswith("SEED_RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise SystemExit(f"the seed's script failed:\n{out.stderr[-3000:]}")
    data = json.loads(line.removeprefix("SEED_RESULT "))
    return _rates(data["seconds"], [data["samples"]] * len(data["seconds"]))


def run_mgpu(epochs: int, device: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as scratch:
        env = _env(device)
        env.update(
            GPUS="none" if device == "cpu" else "0", DATASET="synthetic", QUIET="1",
            EPOCHS=str(epochs), BATCH_SIZE=str(BATCH), VIRTUAL_DEVICES="0", SEED=str(SEED),
            OUTPUT_DIR=str(Path(scratch) / "run"),
        )
        if device == "gpu":
            env.pop("CUDA_VISIBLE_DEVICES")  # mgpu's GPUS=0 sets it
        out = subprocess.run(
            [sys.executable, "-m", "entrypoint", "train"],
            env=env, capture_output=True, text=True, check=False, cwd=scratch,
        )
        if out.returncode != 0:
            raise SystemExit(f"mgpu train failed:\n{out.stderr[-3000:]}")
        metrics = json.loads((Path(scratch) / "run" / "metrics.json").read_text())
    history = metrics["history"]
    samples = (TRAIN_SAMPLES // metrics["global_batch_size"]) * metrics["global_batch_size"]
    return _rates([e["seconds"] for e in history], [samples] * len(history))


def _rates(seconds: list[float], samples: list[int]) -> dict[str, float]:
    steady = (sum(samples[1:]) / sum(seconds[1:])) if len(seconds) > 1 else float("nan")
    return {"all_epochs": sum(samples) / sum(seconds), "after_epoch_1": steady}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--seed-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seed_child:
        seed_child(args.epochs)
        return
    seed_runs, mgpu_runs = [], []
    for repeat in range(args.repeats):
        seed_runs.append(run_seed(args.epochs, args.device))
        mgpu_runs.append(run_mgpu(args.epochs, args.device))
        print(f"run {repeat + 1}: seed {seed_runs[-1]['all_epochs']:,.0f} samples/s, "
              f"mgpu {mgpu_runs[-1]['all_epochs']:,.0f} samples/s", flush=True)
    print(f"\n{args.epochs} epochs of 60000 MNIST-shaped samples, batch {BATCH}, one replica "
          f"on the {args.device.upper()}, median of {args.repeats} run(s):")
    for key, label in (("all_epochs", "all epochs"), ("after_epoch_1", "after epoch 1")):
        seed = statistics.median(r[key] for r in seed_runs)
        mgpu = statistics.median(r[key] for r in mgpu_runs)
        print(f"  {label:14} seed {seed:10,.0f} samples/s   mgpu train {mgpu:10,.0f} "
              f"samples/s   ratio {mgpu / seed:.2f}x")


if __name__ == "__main__":
    main()
