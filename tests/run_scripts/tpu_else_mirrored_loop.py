"""The same pattern with MirroredStrategy() as the fallback, and a custom loop."""
import numpy as np
import tensorflow as tf

try:
    tpu = tf.distribute.cluster_resolver.TPUClusterResolver()
    strategy = tf.distribute.TPUStrategy(tpu)
except (ValueError, tf.errors.NotFoundError):
    strategy = tf.distribute.MirroredStrategy()
GLOBAL_BATCH = 16 * strategy.num_replicas_in_sync
x = np.random.default_rng(0).random((64, 8), dtype=np.float32)
dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(GLOBAL_BATCH)
dist_dataset = strategy.experimental_distribute_dataset(dataset)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.1)


def step(inputs):
    features, labels = inputs
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(tf.reduce_sum((model(features) - labels) ** 2, 1),
                                          global_batch_size=GLOBAL_BATCH)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


@tf.function
def train_step(inputs):
    losses = strategy.run(step, args=(inputs,))
    return strategy.reduce("SUM", losses, axis=None)


for batch in dist_dataset:
    print("loss", float(train_step(batch)), flush=True)
