"""The distributed training and evaluation steps, shared by `mgpu train` and `mgpu bench`.

Why a custom step and not `model.fit`: Keras 3's `model.fit` under
MultiWorkerMirroredStrategy fails with "Attempt to convert a value (PerReplica...) with an
unsupported type ... to a Tensor" (keras-team/keras#20585, open; reproduced with TF 2.21 /
Keras 3.15), while a step run with `strategy.run` inside a `tf.function` works under both
MirroredStrategy and MultiWorkerMirroredStrategy. So one path serves one device, many
GPUs and many workers: the Keras model, optimizer, loss and metrics, driven by our loop.

Speed: `train_steps(iterator, n)` runs n steps in one `tf.function` call (a `tf.range`
loop, like Keras' `steps_per_execution`), so Python runs once per n steps, and the metrics
are read once per call. `train_indexed(rows, order, first, n)` does the same with the rows
already on each device (`training.input.feed.ResidentFeed`): each replica gathers its part of the
call's n global batches by index once, then slices one batch per step, so no input
pipeline runs per step. `train_chunk(chunk, first, n)` slices steps first..first+n-1 the same
way from a chunk of batches a stream prefetched to each device (`training.input.stream.StreamFeed`),
and `train_chunks(iterator, k)` runs k whole chunks taken from the stream inside the call.

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


@dataclass
class StepFunctions:
    """The compiled functions of one run and the Keras metrics they update."""

    train_steps: Any  # (distributed iterator, tf.int32 count) -> None
    train_indexed: Any  # (rows, order, tf.int64 first step, tf.int32 count) -> None
    train_chunk: Any  # ((x, y) of [steps, batch, ...] per replica, tf.int32 first, count) -> None
    train_chunks: Any  # (distributed iterator of such chunks, tf.int32 chunk count) -> None
    evaluate: Any  # (distributed dataset) -> None
    weights_finite: Any  # () -> tf.bool: every trainable weight is finite
    train_loss: Any  # keras.metrics.Mean over per-example losses
    train_accuracy: Any  # keras.metrics.SparseCategoricalAccuracy
    test_loss: Any
    test_accuracy: Any

    def reset_train_metrics(self) -> None:
        self.train_loss.reset_state()
        self.train_accuracy.reset_state()


def make_step_functions(
    strategy: Any,
    model: Any,
    optimizer: Any,
    global_batch_size: int,
    *,
    loss_scaling: bool,
    jit_compile: bool,
    prepare_input: Callable[[Any], Any] | None = None,
) -> StepFunctions:
    """Build the train and evaluation functions. Call after the model and optimizer exist.

    The per-replica loss is the sum of its per-example losses divided by the GLOBAL batch
    (`tf.nn.compute_average_loss`), so the all-reduced SUM of gradients is the gradient of
    the mean loss over the global batch, whatever the replica count. Training batches are
    always full (the data pipeline drops the partial last batch). `prepare_input`, if
    given, turns each training batch into the model's input inside the step (`mgpu bench`
    makes images of MNIST rows for its ResNet).
    """
    # Long: every compiled function below closes over the same model, optimizer, loss and
    # metrics, which must be created once in the strategy's scope; built apart, each would
    # take them all as arguments, and tf.function would trace them as captures anyway.
    import tensorflow as tf

    from mgpu_env.runtime.keras import tensorflow_keras

    keras = tensorflow_keras()
    # Keras 3's LossScaleOptimizer unscales in `apply`; Keras 2's (tf_keras) leaves it to
    # the caller (`get_unscaled_gradients`), and names the scaling `get_scaled_loss`.
    keras_2_scaling = loss_scaling and not hasattr(optimizer, "scale_loss")
    with strategy.scope():
        # "none", not None: Keras 2 takes only the string.
        loss_object = keras.losses.SparseCategoricalCrossentropy(reduction="none")
        train_loss = keras.metrics.Mean(name="loss")
        train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        test_loss = keras.metrics.Mean(name="test_loss")
        test_accuracy = keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")

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

    compute = tf.function(forward_backward, jit_compile=True) if jit_compile else forward_backward

    def replica_step(x: Any, y: Any) -> None:
        per_example, probabilities, gradients = compute(x, y)
        if loss_scaling:
            gradients = _agree_on_finite(gradients)
        # Keras' optimizer all-reduces (sums) the gradients across replicas itself.
        # apply_gradients: the spelling Keras 2 and 3 share.
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        train_loss.update_state(per_example)
        train_accuracy.update_state(y, probabilities)

    def replica_input_step(x: Any, y: Any) -> None:
        if prepare_input is not None:
            x = prepare_input(x)
        replica_step(x, y)

    @tf.function
    def train_steps(iterator: Any, count: Any) -> None:
        for _ in tf.range(count):
            strategy.run(replica_input_step, args=next(iterator))

    replicas = strategy.num_replicas_in_sync
    per_replica = global_batch_size // replicas

    def replica_rows(x_all: Any, y_all: Any, order: Any, first_step: Any, count: Any) -> Any:
        # This replica's rows of the call's `count` steps, gathered at once: replica r of R
        # takes rows [s*G + r*G/R, s*G + (r+1)*G/R) of the order for step s, so global batch
        # s is the same rows whatever R (the id counts every worker's replicas).
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        start = first_step * global_batch_size
        call = order[start : start + tf.cast(count, tf.int64) * global_batch_size]
        mine = tf.reshape(call, [count, replicas, per_replica])[:, replica]
        return tf.gather(x_all, mine), tf.gather(y_all, mine)

    def replica_chunk_step(x_chunk: Any, y_chunk: Any, i: Any) -> None:
        # Slicing whole rows of the first axis shares the chunk's memory: no copy per step.
        replica_input_step(x_chunk[i], y_chunk[i])

    # One gather per call, not one per step: a gather and the index arithmetic in every step
    # cost 11% of the tutorial's MLP step on a CPU (benchmarks/input_cost.py), one per call ~3%.
    # An explicit while_loop and no AutoGraph: converting the step's whole call tree (Keras
    # included) roughly doubled the first call's tracing time, which is paid in epoch 1.
    def run_chunk(chunk: Any, first: Any, end: Any) -> None:
        x_chunk, y_chunk = chunk

        def body(i: Any) -> Any:
            strategy.run(replica_chunk_step, args=(x_chunk, y_chunk, i))
            return (i + 1,)

        tf.while_loop(lambda i: i < end, body, (first,))

    @tf.function(autograph=False)
    def train_indexed(rows: Any, order: Any, first_step: Any, count: Any) -> None:
        x_all, y_all = rows
        chunk = strategy.run(replica_rows, args=(x_all, y_all, order, first_step, count))
        run_chunk(chunk, tf.constant(0), count)

    # A streamed chunk's last one may hold fewer steps: one more trace, then a shape that
    # takes any step count.
    @tf.function(autograph=False, reduce_retracing=True)
    def train_chunk(chunk: Any, first: Any, count: Any) -> None:
        run_chunk(chunk, first, first + count)

    # Whole chunks taken from the stream inside the call: a call of many chunks' steps is one
    # call, as a kept feed's is. Each call from Python costs about as much as a few steps of
    # the MLP, so a call per chunk kept the stream near 83-86% of synthetic where aligned
    # whole-chunk calls reach 93-98% (`benchmarks/input_cost.py --stream`).
    @tf.function(autograph=False)
    def train_chunks(iterator: Any, chunks: Any) -> None:
        def body(c: Any) -> Any:
            chunk = next(iterator)
            # Every replica's chunk holds the same steps; the last one of a run fewer.
            length = tf.shape(strategy.experimental_local_results(chunk[0])[0])[0]
            run_chunk(chunk, tf.constant(0), length)
            return (c + 1,)

        tf.while_loop(lambda c: c < chunks, body, (tf.constant(0),))

    def replica_evaluate(x: Any, y: Any) -> None:
        probabilities = model(x, training=False)
        test_loss.update_state(loss_object(y, probabilities))
        test_accuracy.update_state(y, probabilities)

    @tf.function
    def evaluate(dataset: Any) -> None:
        for x, y in dataset:
            strategy.run(replica_evaluate, args=(x, y))

    # A NaN in the samples can leave the loss finite: on the CPU, ReLU turns NaN into 0, so
    # the activations after the first layer are zeros and the loss settles at chance
    # (ln 2 for 2 classes) while the first layer's weights turn NaN through its gradient.
    # The training loop checks the weights once per call, beside the loss.
    @tf.function(autograph=False)
    def weights_finite() -> Any:
        return tf.reduce_all([tf.reduce_all(tf.math.is_finite(weight))
                              for weight in model.trainable_variables])

    return StepFunctions(
        train_steps, train_indexed, train_chunk, train_chunks, evaluate, weights_finite,
        train_loss, train_accuracy, test_loss, test_accuracy,
    )


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
