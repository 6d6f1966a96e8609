"""The tutorial's model: an MLP 784 -> 64 -> 64 -> 10 with relu and softmax.

Build it inside `strategy.scope()` after `apply_precision`: under a mixed policy the Dense
layers compute in fp16/bf16, while the softmax is a separate float32 layer, because a
softmax in half precision loses the small probabilities the loss needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mgpu_env.training.shared.shapes import CLASSES, FEATURES

HIDDEN_UNITS = 64


def build_model(
    seed: int, input_shape: tuple[int, ...] = (FEATURES,), classes: int = CLASSES
) -> Any:
    """The tutorial's Sequential MLP, with seeded initialisers so SEED fixes the start weights.

    Other sample shapes (a DATASET loader's images) are flattened first; the tutorial's own
    (784,) rows give exactly the tutorial's layers, so its checkpoints stay compatible.
    """
    from mgpu_env.runtime.keras import tensorflow_keras

    keras = tensorflow_keras()

    def init(offset: int) -> Any:
        return keras.initializers.GlorotUniform(seed=seed + offset)

    flatten = [keras.layers.Flatten()] if len(input_shape) != 1 else []
    return keras.Sequential(
        [
            keras.Input(shape=tuple(input_shape), name="pixels"),
            *flatten,
            keras.layers.Dense(HIDDEN_UNITS, activation="relu", kernel_initializer=init(1)),
            keras.layers.Dense(HIDDEN_UNITS, activation="relu", kernel_initializer=init(2)),
            keras.layers.Dense(classes, kernel_initializer=init(3), name="logits"),
            keras.layers.Activation("softmax", dtype="float32", name="softmax"),
        ],
        name="seed_mlp",
    )


def model_builder(
    model: str, seed: int, input_shape: tuple[int, ...], classes: int
) -> Callable[[], Any]:
    """What `build_trainer` calls in the strategy's scope: the tutorial's MLP for MODEL=mlp,
    else the user's `package.module:function`, checked against the data (ConfigError)."""
    if model == "mlp":
        return lambda: build_model(seed, input_shape, classes)
    from mgpu_env.training.step import user_code

    return lambda: user_code.build_model(model, input_shape, classes)


def build_optimizer(learning_rate: float, loss_scaling: bool) -> Any:
    """Adam, wrapped in a dynamic LossScaleOptimizer when fp16 needs loss scaling."""
    from mgpu_env.runtime.keras import tensorflow_keras

    keras = tensorflow_keras()
    optimizer = keras.optimizers.Adam(learning_rate=learning_rate)
    if loss_scaling:
        # Where both Keras 2 and 3 export it.
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer
