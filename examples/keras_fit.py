"""A Keras `model.fit` script on the strategy mgpu-env's settings describe.

    mgpu run examples/keras_fit.py --epochs 3           # GPUS, VIRTUAL_DEVICES, MIXED_PRECISION...
    GPUS=none VIRTUAL_DEVICES=2 mgpu run examples/keras_fit.py --epochs 1
    python examples/keras_fit.py                         # the same settings, read by mgpu_env

`keras.callbacks.BackupAndRestore` saves the training state every epoch in the run folder;
killed and started again with the same RUN_NAME (or OUTPUT_DIR), it goes on from the last
completed epoch. Data: scikit-learn's 8x8 digits (built in, offline).
Between workers (WORKER_HOSTS) this script's `import keras` (Keras 3) cannot train
(keras-team/keras#20585): there use `tf.keras`, which `mgpu run` makes Keras 2 (KERAS=auto),
as TensorFlow's multi-worker `model.fit` tutorial does (tests/processes/test_tutorials.py), or a
custom loop (examples/custom_loop.py).
"""

from __future__ import annotations

import argparse

import keras
import numpy as np
from sklearn.datasets import load_digits

import mgpu_env


def digits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The 1797 digits as 64 values in [0, 1], 80% to train, 20% to test (fixed order)."""
    data = load_digits()
    x = (data.data / 16.0).astype("float32")
    y = data.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per replica")
    args = parser.parse_args()

    # First: it splits the devices and sets the precision policy the first layer takes.
    strategy = mgpu_env.strategy()
    global_batch = mgpu_env.global_batch_size(args.batch_size)
    print(f"replicas: {strategy.num_replicas_in_sync}, global batch: {global_batch}, "
          f"policy: {keras.mixed_precision.global_policy().name}")

    (x_train, y_train), (x_test, y_test) = digits()
    with strategy.scope():
        model = keras.Sequential([
            keras.Input(shape=(64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
            # float32 softmax: a half-precision softmax loses the small probabilities.
            keras.layers.Activation("softmax", dtype="float32"),
        ])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])

    run_dir = mgpu_env.run_dir()
    backup = keras.callbacks.BackupAndRestore(str(run_dir / "backup"))
    # Keras splits each global batch between the replicas.
    model.fit(x_train, y_train, epochs=args.epochs, batch_size=global_batch,
              callbacks=[backup], verbose=2)
    _, accuracy = model.evaluate(x_test, y_test, batch_size=global_batch, verbose=0)
    print(f"test accuracy: {accuracy:.4f}")
    if mgpu_env.is_chief():
        model.save(run_dir / "model.keras")
        print(f"saved {run_dir / 'model.keras'}")


if __name__ == "__main__":
    main()
