# tf.data with the experimental AUTOTUNE alias (still in 2.21): nothing to tell.
import tensorflow as tf

data = tf.data.Dataset.range(8).map(lambda v: v * 2,
                                    num_parallel_calls=tf.data.experimental.AUTOTUNE)
print(sum(int(v) for v in data.prefetch(tf.data.experimental.AUTOTUNE)))
