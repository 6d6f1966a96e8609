"""The seed's model: an MLP 784 -> 64 -> 64 -> 10 with relu and softmax.

Build it inside `strategy.scope()` after `apply_precision`: under a mixed policy the Dense
layers compute in fp16/bf16, while the softmax is a separate float32 layer, because a
softmax in half precision loses the small probabilities the loss needs.
"""

from __future__ import annotations

from typing import Any

from mgpu_env.training.data import CLASSES, FEATURES

HIDDEN_UNITS = 64


def build_model(seed: int) -> Any:
    """The seed's Sequential MLP, with seeded initialisers so SEED fixes the start weights."""
    import keras

    def init(offset: int) -> Any:
        return keras.initializers.GlorotUniform(seed=seed + offset)

    return keras.Sequential(
        [
            keras.Input(shape=(FEATURES,), name="pixels"),
            keras.layers.Dense(HIDDEN_UNITS, activation="relu", kernel_initializer=init(1)),
            keras.layers.Dense(HIDDEN_UNITS, activation="relu", kernel_initializer=init(2)),
            keras.layers.Dense(CLASSES, kernel_initializer=init(3), name="logits"),
            keras.layers.Activation("softmax", dtype="float32", name="softmax"),
        ],
        name="seed_mlp",
    )


def build_optimizer(learning_rate: float, loss_scaling: bool) -> Any:
    """Adam, wrapped in a dynamic LossScaleOptimizer when fp16 needs loss scaling."""
    import keras

    optimizer = keras.optimizers.Adam(learning_rate=learning_rate)
    if loss_scaling:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
