# TF 1.x code as a 2018 blog wrote it, under `import tensorflow as tf`.
import numpy as np
import tensorflow as tf

tf.set_random_seed(0)
x = tf.placeholder(tf.float32, [None, 2])
w = tf.Variable(tf.zeros([2, 1]))
loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
train = tf.train.AdamOptimizer(0.01).minimize(loss)
init = tf.global_variables_initializer()
with tf.Session() as sess:
    sess.run(init)
    sess.run(train, {x: np.ones((4, 2), "float32")})
