"""CentralStorageStrategy: variables on the CPU, compute mirrored over the local devices."""
import numpy as np
import tensorflow as tf

strategy = tf.distribute.experimental.CentralStorageStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = np.random.default_rng(0).random((64, 8), dtype=np.float32)
model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)
