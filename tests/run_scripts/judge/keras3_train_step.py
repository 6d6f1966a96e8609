"""Keras 3 native: a subclassed model with its own train_step, built under mgpu's strategy."""
import keras
import numpy as np
import tensorflow as tf

import mgpu_env


class Regressor(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(1, dtype="float32")

    def call(self, x):
        return self.out(self.hidden(x))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((self(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        return {"loss": loss}


with mgpu_env.strategy().scope():
    model = Regressor()
    model.compile(optimizer="adam")
x = np.random.default_rng(0).random((64, 4), dtype=np.float32)
model.fit(x, x[:, :1], batch_size=mgpu_env.global_batch_size(8), epochs=1, verbose=0)
