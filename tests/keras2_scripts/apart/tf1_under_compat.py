# TF 1.x code run through tf.compat.v1, as the migration guide's first step keeps it.
import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()
x = tf.placeholder(tf.float32, [None, 2])
w = tf.get_variable("w", [2, 1])
loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
train = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    for _ in range(3):
        sess.run(train, {x: np.ones((4, 2), "float32")})
print("trained")
