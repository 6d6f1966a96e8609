# strategy.reduce as TF 2.0 betas wrote it (axis became required).
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
per_replica = strategy.run(lambda: tf.constant(1.0))
print(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica))
