# An exponential warm decay written as a schedule class (a 2020 Kaggle kernel's shape).
import tensorflow as tf


class ExpDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, lr, rate):
        self.lr, self.rate = lr, rate

    def __call__(self, step):
        return self.lr * tf.math.exp(-self.rate * step)


model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(tf.keras.optimizers.SGD(ExpDecay(0.1, 0.01)), "mse")
model.fit(tf.zeros((8, 3)), tf.zeros((8, 1)), epochs=1, verbose=0)
print("trained")
