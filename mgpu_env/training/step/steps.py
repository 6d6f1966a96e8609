"""The distributed training and evaluation steps, shared by `mgpu train` and `mgpu bench`.

Why a custom step and not `model.fit`: Keras 3's `model.fit` under
MultiWorkerMirroredStrategy fails with "Attempt to convert a value (PerReplica...) with an
unsupported type ... to a Tensor" (keras-team/keras#20585, open; reproduced with TF 2.21 /
Keras 3.15), while a step run with `strategy.run` inside a `tf.function` works under both
MirroredStrategy and MultiWorkerMirroredStrategy. So one path serves one device, many
GPUs and many workers: the Keras model, optimizer, loss and metrics, driven by our loop.

The steps are one replica's training step (`StepFunctions.replica_step`, run by
`strategy.run`) and one evaluation: nothing here knows how batches arrive. The trainer's
loops (`training.step.loops`) wrap the replica step in a compiled loop over whatever source a
feed gives, many steps per `tf.function` call, as Keras' `multi_step_on_iterator` wraps
`one_step_on_iterator`; so a new feed changes no step.

With XLA on, only the forward and backward pass of each replica is jit-compiled: the
gradient all-reduce and the optimizer update stay outside XLA, because they use the
strategy's `merge_call`, which XLA cannot compile (under MirroredStrategy a fully compiled
step fails with "Trying to access resource ... located in device CPU:1 from device CPU:0",
with or without mixed precision). This split works with mixed precision too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mgpu_env.runtime.precision import PrecisionChoice

# One replica's training step on its batch (x, y), called inside `strategy.run`.
ReplicaStep = Callable[[Any, Any], None]


@dataclass
class StepMetrics:
    """The loss and the Keras metrics the steps update, made in the strategy's scope."""

    loss_object: Any  # SparseCategoricalCrossentropy, one loss per example
    train_loss: Any  # keras.metrics.Mean over per-example losses
    train_accuracy: Any  # keras.metrics.SparseCategoricalAccuracy
    test_loss: Any
    test_accuracy: Any

    @classmethod
    def create(cls, strategy: Any) -> StepMetrics:
        from mgpu_env.runtime.keras import tensorflow_keras

        keras = tensorflow_keras()
        with strategy.scope():
            # "none", not None: Keras 2 takes only the string.
            return cls(
                keras.losses.SparseCategoricalCrossentropy(reduction="none"),
                keras.metrics.Mean(name="loss"),
                keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
                keras.metrics.Mean(name="test_loss"),
                keras.metrics.SparseCategoricalAccuracy(name="test_accuracy"),
            )


@dataclass
class StepFunctions:
    """One replica's training step, the compiled evaluation and weight check of one run, and
    the Keras metrics they update."""

    replica_step: ReplicaStep
    evaluate: Any  # (distributed dataset) -> None
    weights_finite: Any  # () -> tf.bool: every trainable weight is finite
    train_loss: Any  # keras.metrics.Mean over per-example losses
    train_accuracy: Any  # keras.metrics.SparseCategoricalAccuracy
    test_loss: Any
    test_accuracy: Any

    def reset_train_metrics(self) -> None:
        self.train_loss.reset_state()
        self.train_accuracy.reset_state()


@dataclass(frozen=True)
class StepSpec:
    """What a training step is built from besides the model: the optimizer's learning rate,
    the precision (and so its loss scaling), the global batch the loss averages over, and
    whether the forward and backward pass is XLA-compiled. `mgpu train` takes them from its
    plan, each `mgpu bench` point from its spec."""

    learning_rate: float
    precision: PrecisionChoice
    global_batch_size: int
    jit_compile: bool

    @property
    def loss_scaling(self) -> bool:
        return self.precision.loss_scaling


def make_step_functions(
    strategy: Any,
    model: Any,
    optimizer: Any,
    spec: StepSpec,
    *,
    prepare_input: Callable[[Any], Any] | None = None,
) -> StepFunctions:
    """Build the replica step and the evaluation. Call after the model and optimizer exist.

    The per-replica loss is the sum of its per-example losses divided by the GLOBAL batch
    (`tf.nn.compute_average_loss`), so the all-reduced SUM of gradients is the gradient of
    the mean loss over the global batch, whatever the replica count. Training batches are
    always full (every feed drops the partial last batch). `prepare_input`, if given, turns
    each training batch into the model's input inside the step (`mgpu bench` makes images
    of MNIST rows for its ResNet).
    """
    metrics = StepMetrics.create(strategy)
    compute = _forward_backward(model, optimizer, metrics.loss_object, spec)

    def replica_step(x: Any, y: Any) -> None:
        if prepare_input is not None:
            x = prepare_input(x)
        per_example, probabilities, gradients = compute(x, y)
        if spec.loss_scaling:
            gradients = _agree_on_finite(gradients)
        # Keras' optimizer all-reduces (sums) the gradients across replicas itself.
        # apply_gradients: the spelling Keras 2 and 3 share.
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        metrics.train_loss.update_state(per_example)
        metrics.train_accuracy.update_state(y, probabilities)

    return StepFunctions(
        replica_step, _evaluation(strategy, model, metrics), _weights_check(model),
        metrics.train_loss, metrics.train_accuracy, metrics.test_loss, metrics.test_accuracy,
    )


def _forward_backward(
    model: Any, optimizer: Any, loss_object: Any, spec: StepSpec,
) -> Callable[[Any, Any], tuple[Any, Any, list[Any]]]:
    """One replica's forward and backward pass: (x, y) -> (per-example losses, the
    probabilities, the gradients); XLA-compiled when `spec.jit_compile` (see the module's
    docstring for why only this part)."""
    import tensorflow as tf

    # Keras 3's LossScaleOptimizer unscales in `apply`; Keras 2's (tf_keras) leaves it to
    # the caller (`get_unscaled_gradients`), and names the scaling `get_scaled_loss`.
    loss_scaling, global_batch_size = spec.loss_scaling, spec.global_batch_size
    keras_2_scaling = loss_scaling and not hasattr(optimizer, "scale_loss")

    def forward_backward(x: Any, y: Any) -> tuple[Any, Any, list[Any]]:
        with tf.GradientTape() as tape:
            probabilities = model(x, training=True)
            per_example = loss_object(y, probabilities)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
            if keras_2_scaling:
                loss = optimizer.get_scaled_loss(loss)
            elif loss_scaling:
                loss = optimizer.scale_loss(loss)
        gradients = tape.gradient(loss, model.trainable_variables)
        if keras_2_scaling:
            gradients = optimizer.get_unscaled_gradients(gradients)
        return per_example, probabilities, gradients

    if spec.jit_compile:
        return tf.function(forward_backward, jit_compile=True)
    return forward_backward


def _evaluation(strategy: Any, model: Any, metrics: StepMetrics) -> Any:
    """(distributed dataset) -> None: the test loss and accuracy over all of it."""
    import tensorflow as tf

    def replica_evaluate(x: Any, y: Any) -> None:
        probabilities = model(x, training=False)
        metrics.test_loss.update_state(metrics.loss_object(y, probabilities))
        metrics.test_accuracy.update_state(y, probabilities)

    @tf.function
    def evaluate(dataset: Any) -> None:
        for x, y in dataset:
            strategy.run(replica_evaluate, args=(x, y))

    return evaluate


def _weights_check(model: Any) -> Any:
    """() -> tf.bool: whether every trainable weight is finite.

    A NaN in the samples can leave the loss finite: on the CPU, ReLU turns NaN into 0, so
    the activations after the first layer are zeros and the loss settles at chance
    (ln 2 for 2 classes) while the first layer's weights turn NaN through its gradient.
    The training loop checks the weights once per call, beside the loss.
    """
    import tensorflow as tf

    @tf.function(autograph=False)
    def weights_finite() -> Any:
        return tf.reduce_all([tf.reduce_all(tf.math.is_finite(weight))
                              for weight in model.trainable_variables])

    return weights_finite


def _agree_on_finite(gradients: list[Any]) -> list[Any]:
    """Make every replica see non-finite gradients when any replica has them.

    Keras' LossScaleOptimizer checks for inf/NaN on each replica's own gradients before they
    are all-reduced, and under MirroredStrategy acts on replica 0's answer only: an overflow
    on another replica would be summed into the update. One scalar all-reduce makes the
    replicas agree, so the step is skipped (and the loss scale halved) everywhere.
    """
    import tensorflow as tf

    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in gradients])
    overflowed = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.float32)
    )
    poison = tf.where(overflowed > 0, float("nan"), 0.0)
    return [g + tf.cast(poison, g.dtype) for g in gradients]
