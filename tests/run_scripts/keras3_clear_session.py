"""Keras 3 native: clear_session() before each model, as keras.io's examples do."""
import keras
import numpy as np
import tensorflow as tf

keras.backend.clear_session()
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
x = np.random.default_rng(0).random((64, 8), dtype=np.float32)
model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)
print("compute dtype", model.layers[0].compute_dtype, flush=True)
