"""The models `mgpu bench` can measure, by name.

Models `mgpu bench` can measure, by name: the seed's MLP and a small ResNet, or the user's
builder (`MODEL=package.module:function`), built for the samples they are fed: MNIST-shaped
ones, or the shape a DATASET loader's samples have.

The MLP alone is too small for scaling to mean much: its step is dominated by fixed
per-step costs, so more replicas mostly add all-reduce time. The ResNet (3 stages of
residual blocks on 32x32x3 images, about 0.7M parameters, ~0.2 GFLOP per sample forward)
has enough compute per sample for the all-reduce to be amortised, as in NVIDIA's and
Horovod's ResNet scaling tables, while staying fast enough for a laptop. `resnet50` is
Keras' ResNet-50 itself (25.6M parameters, 1000 classes), untrained, on synthetic 224x224x3
images: the workload of NVIDIA's published TensorFlow scaling tables, so a machine's
efficiency compares with theirs (on CPUs, a step takes seconds: use a small BATCH_SIZE).
Build them inside `strategy.scope()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MODELS: tuple[str, ...] = ("mlp", "resnet", "resnet50")


@dataclass(frozen=True)
class ModelShape:
    """What a model takes and predicts, so synthetic data can be made to fit it."""

    input_shape: tuple[int, ...]
    classes: int


SHAPES: dict[str, ModelShape] = {
    "mlp": ModelShape((784,), 10),
    "resnet": ModelShape((32, 32, 3), 10),
    "resnet50": ModelShape((224, 224, 3), 1000),
}
# A MODEL builder is measured on what `mgpu train` feeds it from the built-in data sets:
# rows of 784 values, 10 classes (a DATASET loader's samples give their own shape).
HOOK_SHAPE = ModelShape((784,), 10)


def bench_model(model: str, bench_model_name: str) -> str:
    """What `mgpu bench` measures: the MODEL builder when one is set, else BENCH_MODEL."""
    return model if ":" in model else bench_model_name


def model_shape(name: str) -> ModelShape:
    return HOOK_SHAPE if ":" in name else SHAPES[name]


def build_model(name: str, seed: int, shape: ModelShape) -> Any:
    """A fresh Keras model by name or builder, taking samples of `shape`; softmax outputs in
    float32 under mixed precision (the builder's contract asks for it too)."""
    from mgpu_env.runtime.keras import tensorflow_keras

    if ":" in name:
        from mgpu_env.training.step import user_code

        tensorflow_keras().utils.set_random_seed(seed)
        return user_code.build_model(name, shape.input_shape, shape.classes)
    if name == "mlp":
        from mgpu_env.training.step.model import build_model as build_seed_mlp

        return build_seed_mlp(seed, shape.input_shape, shape.classes)
    if name == "resnet":
        tensorflow_keras().utils.set_random_seed(seed)
        return build_small_resnet(shape.input_shape, classes=shape.classes)
    if name == "resnet50":
        tensorflow_keras().utils.set_random_seed(seed)
        return build_resnet50(shape.input_shape, classes=shape.classes)
    raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")


def build_small_resnet(
    input_shape: tuple[int, ...] = SHAPES["resnet"].input_shape,
    widths: tuple[int, ...] = (32, 64, 128), blocks_per_stage: int = 2, classes: int = 10
) -> Any:
    """A CIFAR-style ResNet: stem, stages of basic residual blocks, global pooling, softmax."""
    from mgpu_env.runtime.keras import tensorflow_keras

    keras = tensorflow_keras()
    layers = keras.layers

    def block(x: Any, filters: int, stride: int) -> Any:
        shortcut = x
        y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        y = layers.BatchNormalization()(y)
        y = layers.ReLU()(y)
        y = layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
        y = layers.BatchNormalization()(y)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
            shortcut = layers.BatchNormalization()(shortcut)
        return layers.ReLU()(layers.Add()([y, shortcut]))

    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(widths[0] // 2, 3, padding="same", use_bias=False)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    for stage, filters in enumerate(widths):
        for index in range(blocks_per_stage):
            x = block(x, filters, 2 if stage > 0 and index == 0 else 1)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(classes)(x)
    outputs = layers.Activation("softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="small_resnet")


def build_resnet50(input_shape: tuple[int, ...] = SHAPES["resnet50"].input_shape,
                   classes: int = 1000) -> Any:
    """Keras' ResNet-50 with random weights (`weights=None`: nothing is downloaded), its
    softmax in float32 under mixed precision as NVIDIA's runs have it."""
    from mgpu_env.runtime.keras import tensorflow_keras

    keras = tensorflow_keras()
    base = keras.applications.ResNet50(weights=None, input_shape=input_shape, classes=classes,
                                       classifier_activation=None)
    outputs = keras.layers.Activation("softmax", dtype="float32")(base.output)
    return keras.Model(base.input, outputs, name="resnet50")
