"""The tutorial's script, as the tutorial prints it, with the one fix it needs to run.

As printed, `x_train` is 28x28 images fed to a 784-input Dense layer; here the images are
flattened (`reshape(-1, 784)`). Everything else is the tutorial's code. It is the baseline
that `benchmarks/seed_vs_mgpu.py` and `mgpu bench` (BENCH_COMPARE=1) measure against, kept
in the package so the image, which ships only the packages, has it too.

    python -m mgpu_env.training.tutorial     # the tutorial's run on MNIST (downloads it)
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.keras.layers import Dense
from tensorflow.keras.models import Sequential
from tensorflow.keras.optimizers import Adam


def seed_model(learning_rate: float = 0.001) -> Any:
    """The tutorial's MLP, compiled as the tutorial compiles it. Call it inside
    `strategy.scope()`."""
    model = Sequential([Dense(64, activation='relu', input_shape=(784,)),
                        Dense(64, activation='relu'),
                        Dense(10, activation='softmax')])
    model.compile(loss='sparse_categorical_crossentropy', optimizer=Adam(learning_rate),
                  metrics=['accuracy'])
    return model


def train(x_train: Any, y_train: Any, epochs: int = 5, batch_size: int = 64,
          callbacks: list[Any] | None = None) -> Any:
    strategy = tf.distribute.MirroredStrategy()
    print('Number of devices: {}'.format(strategy.num_replicas_in_sync))  # noqa: UP032
    with strategy.scope():
        model = seed_model()
    model.fit(x_train, y_train, epochs=epochs, batch_size=batch_size, callbacks=callbacks)
    return model


if __name__ == "__main__":
    (x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data()
    x_train, x_test = x_train / 255.0, x_test / 255.0
    x_train, x_test = x_train.reshape(-1, 784), x_test.reshape(-1, 784)  # the fix
    train(x_train, y_train)
