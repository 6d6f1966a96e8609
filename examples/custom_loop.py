"""A custom training loop on the strategy mgpu-env's settings describe.

    mgpu run examples/custom_loop.py --epochs 3
    WORKER_HOSTS=a:2222,b:2222 WORKER_INDEX=0 RUN_NAME=exp mgpu run examples/custom_loop.py

The pieces every distributed loop needs: the global batch (`mgpu_env.global_batch_size`),
each replica's loss divided by it (`tf.nn.compute_average_loss`), `strategy.run` inside a
`tf.function`, a dataset split by `experimental_distribute_dataset`, a checkpoint per
epoch in the run folder that a restart resumes, and outputs written by the chief only.
It works under MirroredStrategy and MultiWorkerMirroredStrategy alike.
Data: scikit-learn's 8x8 digits (built in, offline).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import keras
import tensorflow as tf
from keras_fit import digits  # next to this script: python puts its folder on sys.path

import mgpu_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per replica")
    parser.add_argument("--learning-rate", type=float, default=0.001)
    args = parser.parse_args()

    strategy = mgpu_env.strategy()  # first: devices, precision policy, cluster
    global_batch = mgpu_env.global_batch_size(args.batch_size)
    (x_train, y_train), (x_test, y_test) = digits()

    with strategy.scope():
        model = keras.Sequential([
            keras.Input(shape=(64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
            keras.layers.Activation("softmax", dtype="float32"),
        ])
        optimizer = keras.optimizers.Adam(args.learning_rate)
        optimizer.build(model.trainable_variables)
        loss_object = keras.losses.SparseCategoricalCrossentropy(reduction=None)
        accuracy = keras.metrics.SparseCategoricalAccuracy()
        epoch = tf.Variable(0, dtype=tf.int64, trainable=False)

    # The chief keeps the checkpoints in the run folder; the other workers must save too
    # (saving is collective) but into a scratch folder of their own.
    folder = mgpu_env.run_dir() / "checkpoints" if mgpu_env.is_chief() else Path(
        tempfile.mkdtemp(prefix="worker-ckpt-"))
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)
    manager = tf.train.CheckpointManager(checkpoint, str(folder), max_to_keep=2)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint)
        print(f"resuming after epoch {int(epoch.numpy())}")

    def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            probabilities = model(x, training=True)
            loss = tf.nn.compute_average_loss(loss_object(y, probabilities),
                                              global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        accuracy.update_state(y, probabilities)
        return loss

    @tf.function
    def train_epoch(iterator: tf.distribute.DistributedIterator, steps: tf.Tensor) -> tf.Tensor:
        total = tf.constant(0.0)
        for _ in tf.range(steps):
            per_replica = strategy.run(replica_step, args=next(iterator))
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return total / tf.cast(steps, tf.float32)

    steps = len(x_train) // global_batch
    for current in range(int(epoch.numpy()), args.epochs):
        data = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        data = data.shuffle(len(x_train), seed=current).batch(global_batch, drop_remainder=True)
        iterator = iter(strategy.experimental_distribute_dataset(data))
        accuracy.reset_state()
        loss = train_epoch(iterator, tf.constant(steps))
        epoch.assign(current + 1)
        manager.save(checkpoint_number=current + 1)
        print(f"epoch {current + 1}/{args.epochs}: loss {float(loss):.4f}, "
              f"accuracy {float(accuracy.result()):.4f}")

    probabilities = model.predict(x_test, batch_size=global_batch, verbose=0)
    test_accuracy = float(keras.metrics.sparse_categorical_accuracy(
        y_test, probabilities).numpy().mean())
    print(f"test accuracy: {test_accuracy:.4f}")


if __name__ == "__main__":
    main()
