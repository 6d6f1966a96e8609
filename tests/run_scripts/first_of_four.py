"""Trains under its first MirroredStrategy(), then only builds three more strategies."""
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = np.random.default_rng(0).random((64, 8), dtype=np.float32)
model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)
# Later cells compare strategies without training under them.
others = [tf.distribute.MirroredStrategy(["/cpu:0"]),
          tf.distribute.OneDeviceStrategy("/cpu:0"),
          tf.distribute.experimental.CentralStorageStrategy()]
print("built", [type(s).__name__ for s in others], flush=True)
