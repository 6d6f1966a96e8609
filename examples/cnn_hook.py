"""A small CNN for `mgpu train`'s loop, and an image loader, as hooks.

    MODEL=examples.cnn_hook:build mgpu train                 # on MNIST/digits rows (784,)
    MODEL=examples.cnn_hook:build DATASET=examples.cnn_hook:load_digits mgpu train
    MODEL=examples.cnn_hook:build DATASET=fashion_mnist mgpu train
    MODEL=examples.cnn_hook:build mgpu bench                 # what more GPUs buy for it

mgpu builds the model in the strategy's scope under the precision policy, trains it with
its own step (Adam, sparse categorical cross-entropy), checkpoints every epoch, resumes
after a kill, writes metrics.json, TensorBoard logs and `model.keras` (this model).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def build(input_shape: tuple[int, ...], num_classes: int) -> Any:
    """An uncompiled CNN for 28x28 images, given as (784,) rows or (28, 28[, 1]) arrays."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape)
    side = round(float(np.prod(input_shape)) ** 0.5)
    x = layers.Reshape((side, side, 1))(inputs)  # rows or images: one channel
    x = layers.Conv2D(16, 3, activation="relu", padding="same")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(32, 3, activation="relu", padding="same")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Flatten()(x)
    x = layers.Dense(64, activation="relu")(x)
    x = layers.Dense(num_classes)(x)
    # float32 softmax: under mixed precision the Dense above computes in fp16/bf16.
    outputs = layers.Activation("softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="small_cnn")


def load_digits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """scikit-learn's digits as 28x28x1 images in [0, 1] (offline): the DATASET contract,
    `((x_train, y_train), (x_test, y_test))` with integer labels."""
    from sklearn.datasets import load_digits as sklearn_digits

    data = sklearn_digits()
    images = np.kron(data.images, np.ones((3, 3))) / 16.0  # 8x8 -> 24x24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))[..., None].astype("float32")
    labels = data.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], labels[order]
    split = int(0.8 * len(images))
    return (images[:split], labels[:split]), (images[split:], labels[split:])
