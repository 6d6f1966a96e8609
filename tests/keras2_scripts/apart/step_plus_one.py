# A warmup schedule that shifts the step by one first (the step is still int64).
import tensorflow as tf


class Warmup(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        step = step + 1
        return 0.001 * tf.math.rsqrt(step)


opt = tf.keras.optimizers.Adam(Warmup())
v = tf.Variable(1.0)
opt.apply_gradients([(tf.constant(1.0), v)])
print("applied")
