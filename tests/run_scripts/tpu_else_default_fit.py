"""The Kaggle/Colab pattern: a TPU, else MirroredStrategy over the GPUs, else the default."""
import numpy as np
import tensorflow as tf

try:
    tpu = tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.config.experimental_connect_to_cluster(tpu)
    tf.tpu.experimental.initialize_tpu_system(tpu)
    strategy = tf.distribute.TPUStrategy(tpu)
except (ValueError, tf.errors.NotFoundError):
    gpus = tf.config.list_logical_devices("GPU")
    strategy = (tf.distribute.MirroredStrategy([g.name for g in gpus]) if len(gpus) > 1
                else tf.distribute.get_strategy())
print("REPLICAS:", strategy.num_replicas_in_sync, flush=True)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
x = np.random.default_rng(0).random((64, 8), dtype=np.float32)
model.fit(x, x[:, :1], batch_size=16 * strategy.num_replicas_in_sync, epochs=1, verbose=0)
