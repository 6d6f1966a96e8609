"""What one checkpoint of `mgpu train` costs: seconds to save and MB on disk, per model.

    .venv/bin/python benchmarks/checkpoint_cost.py [--models mlp,resnet50] [--saves 5]

Each model is built as `mgpu train` builds it (`build_trainer`: the model and Adam with its
slots, one CPU replica, float32) and saved `--saves` times by the run's own `Checkpoints`
(the model, the optimizer, the position, the running metrics, the random state) into a
temporary folder, each save a checkpoint inside an epoch as CHECKPOINT_EVERY makes them
(the 3 latest kept, the older deleted). Printed per model: its parameters, one
checkpoint's MB, and the first, median and max seconds of a save (the first includes
TensorFlow tracing the save). `mlp` is the tutorial's MLP on MNIST's shape; `resnet50` is
Keras' ResNet50 (random weights, 224x224x3, 1000 classes: 25.6 M parameters).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def builder(name: str) -> Callable[[], Any]:
    from mgpu_env.runtime.keras import tensorflow_keras
    from mgpu_env.training.step.model import build_model

    if name == "mlp":
        return lambda: build_model(0)
    if name == "resnet50":
        keras = tensorflow_keras()
        return lambda: keras.applications.ResNet50(weights=None)
    raise SystemExit(f"--models: {name!r} is not one of mlp, resnet50")


def measure(name: str, saves: int) -> None:
    import tensorflow as tf

    from mgpu_env.runtime.precision import FLOAT32, PrecisionChoice
    from mgpu_env.training.run.checkpoints import Checkpoints, Position
    from mgpu_env.training.step.build import build_trainer
    from mgpu_env.training.step.steps import StepSpec

    trainer = build_trainer(
        tf.distribute.MirroredStrategy(["/cpu:0"]), builder(name),
        StepSpec(learning_rate=0.001, precision=PrecisionChoice(FLOAT32, False, "benchmark"),
                 global_batch_size=64, jit_compile=False),
    )
    params = sum(int(tf.size(v)) for v in trainer.model.trainable_variables)
    with tempfile.TemporaryDirectory(prefix="ckpt-cost-") as folder:
        checkpoints = Checkpoints(trainer, Path(folder))
        costs = [checkpoints.save(Position(0, step + 1)) for step in range(saves)]
    seconds = [c.seconds for c in costs]
    print(f"{name}: {params / 1e6:.2f} M parameters; one checkpoint {costs[-1].mb:.1f} MB "
          f"(estimated {checkpoints.estimated_bytes() / 1e6:.1f}); save first "
          f"{seconds[0]:.3f} s, median {statistics.median(seconds[1:] or seconds):.3f} s, "
          f"max {max(seconds[1:] or seconds):.3f} s ({saves} saves)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,resnet50")
    parser.add_argument("--saves", type=int, default=5)
    args = parser.parse_args()
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        measure(name, args.saves)


if __name__ == "__main__":
    main()
