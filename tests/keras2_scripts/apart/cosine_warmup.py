# Linear warmup then cosine decay (a 2021 blog's schedule), the step used as given.
import numpy as np
import tensorflow as tf


class WarmupCosine(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, base, warmup, total):
        self.base, self.warmup, self.total = base, warmup, total

    def __call__(self, step):
        cosine = 0.5 * self.base * (1 + tf.math.cos(np.pi * step / self.total))
        return tf.where(step < self.warmup, self.base * step / self.warmup, cosine)


model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(tf.keras.optimizers.Adam(WarmupCosine(1e-3, 10, 100)), "mse")
model.fit(np.zeros((8, 3)), np.zeros((8, 1)), epochs=1, verbose=0)
print("trained")
