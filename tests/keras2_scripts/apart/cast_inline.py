# A schedule that casts inside the expression (TensorFlow's current Transformer tutorial).
import tensorflow as tf


class Warmup(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 0.001 * tf.math.rsqrt(tf.cast(step, tf.float32) + 1.0)


opt = tf.keras.optimizers.Adam(Warmup())
v = tf.Variable(1.0)
opt.apply_gradients([(tf.constant(1.0), v)])
print("applied")
