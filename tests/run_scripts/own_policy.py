"""Sets its own mixed precision policy, and keeps its output layer in float32."""
import numpy as np
import tensorflow as tf

tf.keras.mixed_precision.set_global_policy("mixed_float16")
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4),
                                 tf.keras.layers.Dense(1, dtype="float32")])
    model.compile(optimizer="sgd", loss="mse")
x = np.random.default_rng(0).random((64, 8), dtype=np.float32)
model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)
